//! [`Db::check`]: what claims on a source would meet on the live database, found without claiming
//! or writing anything: the strategy `auto` picks and why, whether the statements that find ready
//! rows and rows whose lease expired read them through an index (the server's own plan of
//! them), privileges, the server's settings that matter (a standby, the default isolation,
//! MySQL/MariaDB's binary log format, a Galera cluster) and the clock leases run on.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::backend::{Lookup, Need, Reads, Resolved, ServerInfo};
use crate::claim::{auto_choice, Layer};
use crate::db::Db;
use crate::error::{Error, Result};
use crate::mapping::{Mapping, TableName};
use crate::registry::RecordedSource;
use crate::report::{Finding, Severity, Topic};
use crate::source::Source;
use crate::strategy::Strategy;

mod expired;

/// What [`Db::check`] found for one source.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct CheckReport {
    /// The table, as it was named.
    pub table: String,
    /// Where the database is ([`Db::endpoint`]: never a password).
    pub database: String,
    /// The server and its version ([`crate::ServerInfo::description`]).
    pub server: String,
    /// The strategy that was asked for.
    pub asked: Strategy,
    /// The strategy the findings are about: the one asked for (`auto` resolved), or `auto`'s pick
    /// when the one asked for cannot run here (the [`Topic::Strategy`] finding says why).
    pub strategy: Strategy,
    /// What `auto` picks for this table on this server.
    pub auto: Strategy,
    /// Why `auto` picks it.
    pub auto_reason: String,
    /// What was found, in a fixed order of topics.
    pub findings: Vec<Finding>,
}

impl CheckReport {
    /// The most serious finding's severity ([`Severity::Ok`] when there are none).
    pub fn worst(&self) -> Severity {
        self.findings
            .iter()
            .map(|f| f.severity)
            .max()
            .unwrap_or(Severity::Ok)
    }

    /// How many findings have `severity`.
    pub fn count(&self, severity: Severity) -> usize {
        self.findings
            .iter()
            .filter(|f| f.severity == severity)
            .count()
    }
}

/// A clock skew worth mentioning, and one worth a warning (leases are computed by the database's
/// clock, so skew moves no lease; it misleads whoever reads lease times against a local clock).
const SKEW_MENTION_MS: i64 = 1_000;
const SKEW_WARN_MS: i64 = 5 * 60 * 1_000;

impl Db {
    /// Checks what claims on `source` with `strategy` would meet on this database, without
    /// claiming or writing anything (no record in the source registry, no `rowclaim_leases`).
    ///
    /// Input a claimer would refuse (a name that is not an identifier, a missing table or
    /// column, a `--where` that is not a condition on the table) is an error, as for
    /// [`Db::claimer`]; everything else is a [`Finding`]: a strategy the server cannot do, a
    /// mapping that differs from the recorded one, a claim without a fitting index, …
    ///
    /// ```no_run
    /// # async fn demo() -> rowclaim::Result<()> {
    /// use rowclaim::{Db, Severity, Source, Strategy};
    ///
    /// let db = Db::connect("postgres://app@localhost/app").await?;
    /// let source = Source::new("emails").owner_column("owner").lease_column("lease_until");
    /// let report = db.check(source, Strategy::Auto).await?;
    /// for f in report.findings.iter().filter(|f| f.severity >= Severity::Warning) {
    ///     println!("{}: {}", f.topic, f.message);
    ///     if let Some(fix) = &f.fix {
    ///         println!("  fix: {fix}");
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn check(&self, source: Source, strategy: Strategy) -> Result<CheckReport> {
        self.check_source(&source, strategy, None).await
    }

    /// [`Db::check`] of a source, completed by `layer` when a layer above owns its table.
    pub(crate) async fn check_source(
        &self,
        source: &Source,
        asked: Strategy,
        layer: Option<&dyn Layer>,
    ) -> Result<CheckReport> {
        let (m, columns) = self.live_mapping(source, layer).await?;
        let server = self.backend.catalog().server().await?;
        // A table a layer above owns (the managed queue's) has no record: its mapping is the
        // layer's, the same for every claimer.
        let owned = m.lifecycle.is_some();
        // A record this user may not read is a finding (and the privileges finding names the
        // grant), not the end of the check.
        let (record, unreadable) = match owned {
            true => (None, None),
            false => match self.record_of(&m).await {
                Err(e) if e.kind() == crate::error::ErrorKind::PermissionDenied => (None, Some(e)),
                other => (other?, None),
            },
        };

        let (auto, auto_reason) = auto_following(&server, &m, record.as_ref());
        let (strategy, said) = strategy_finding(asked, &server, &m, auto, &auto_reason)?;
        let mut findings = vec![said];
        if let Some(e) = unreadable {
            findings.push(Finding::new(
                Topic::Registry,
                Severity::Error,
                format!(
                    "this user may not read {}, where the mapping every claimer of {} must agree \
                     on is kept ({e}): claims fail without it (the privileges finding names the \
                     grant)",
                    crate::registry::TABLE,
                    m.table_display
                ),
            ));
        } else if !owned {
            findings.push(self.registry_finding(&m, strategy, record.as_ref()).await?);
        }
        if !owned {
            findings.push(self.id_finding(&m).await?);
        }
        let resolved = Resolved::of(strategy)?;
        let leases_exist = self.table_exists("rowclaim_leases").await?;
        findings.push(
            self.index_finding(
                &m,
                resolved,
                strategy == Strategy::LeaseTable && leases_exist,
            )
            .await?,
        );
        findings.extend(self.expired_finding(&m, resolved).await?);
        findings.push(
            self.privileges_finding(&m, strategy, record.is_some(), leases_exist)
                .await?,
        );
        findings.extend(
            self.backend
                .inspect()
                .settings(&m, strategy, &columns)
                .await?,
        );
        findings.push(self.clock_finding().await?);

        Ok(CheckReport {
            table: m.table_display.clone(),
            database: self.endpoint().to_owned(),
            server: server.description.clone(),
            asked,
            strategy,
            auto,
            auto_reason,
            findings,
        })
    }

    async fn table_exists(&self, name: &str) -> Result<bool> {
        let table = TableName::parse(name)?;
        Ok(!self.backend.catalog().columns(&table).await?.is_empty())
    }

    /// Whether the id column names one row: claimers refuse a table where it may not.
    async fn id_finding(&self, m: &Mapping) -> Result<Finding> {
        match self.id_unique(m).await {
            Ok(()) => Ok(Finding::ok(
                Topic::IdColumn,
                format!(
                    "{}.{} names one row (a primary key or a unique index of its own)",
                    m.table_display, m.id_name
                ),
            )),
            Err(e) => match &e {
                Error::IdNotUnique { fix, .. } => {
                    Ok(
                        Finding::new(Topic::IdColumn, Severity::Error, e.to_string())
                            .fix(fix.clone()),
                    )
                }
                _ => Err(e),
            },
        }
    }

    /// The mapping against the table's record: agrees, none yet, or differs (claimers with this
    /// mapping would be refused).
    async fn registry_finding(
        &self,
        m: &Mapping,
        strategy: Strategy,
        record: Option<&RecordedSource>,
    ) -> Result<Finding> {
        let Some(record) = record else {
            let registry = if self.table_exists(crate::registry::TABLE).await? {
                ""
            } else {
                " (and creates that table)"
            };
            return Ok(Finding::new(
                Topic::Registry,
                Severity::Advice,
                format!(
                    "no claimer has recorded a mapping for {} yet: the first claim records this \
                     one in {}{registry}, and every later claimer must map the table alike",
                    m.table_display,
                    crate::registry::TABLE
                ),
            ));
        };
        let mine = RecordedSource::of(m, strategy);
        Ok(
            match crate::registry::agree(&m.table_display, &mine, record.clone()) {
                Ok(_) => Finding::ok(
                    Topic::Registry,
                    format!(
                        "agrees with the mapping recorded for {} on {} (claims kept {})",
                        m.table_display,
                        humantime::format_rfc3339_seconds(record.recorded_time()),
                        record.claims
                    ),
                ),
                Err(e) => Finding::new(Topic::Registry, Severity::Error, e.to_string()).fix(
                    "map the table as recorded, or, once no claimer uses the recorded mapping \
                     any more, `rowclaim source replace` with this mapping's table flags",
                ),
            },
        )
    }

    /// Plans the statement that finds ready rows and says how it reads the table.
    async fn index_finding(
        &self,
        m: &Mapping,
        strategy: Resolved,
        leases: bool,
    ) -> Result<Finding> {
        let explained = self
            .backend
            .inspect()
            .explain_lookup(m, strategy, leases)
            .await;
        let lookup = match explained {
            Ok(l) => l,
            Err(e) if e.is_connection() => return Err(e),
            Err(e) => {
                return Ok(Finding::new(
                    Topic::ClaimIndex,
                    Severity::Advice,
                    format!("the claim's statement could not be explained: {e}"),
                ))
            }
        };
        let fix = if let Some(l) = &m.lifecycle {
            // The indexes of a table a layer above owns are that layer's to make.
            l.index_fix.to_owned()
        } else {
            self.backend.inspect().lookup_index(m, strategy)
        };
        Ok(index_verdict(m, &lookup, fix))
    }

    async fn privileges_finding(
        &self,
        m: &Mapping,
        strategy: Strategy,
        recorded: bool,
        leases_exist: bool,
    ) -> Result<Finding> {
        const ROWS: &[&str] = &["SELECT", "UPDATE"];
        let mut needs = vec![Need {
            table: m.source_key.clone(),
            exists: true,
            privileges: ROWS,
        }];
        let mut uses = vec![format!("SELECT and UPDATE on {}", m.table_display)];
        if strategy == Strategy::LeaseTable {
            needs.push(Need {
                table: "rowclaim_leases".into(),
                exists: leases_exist,
                privileges: &["SELECT", "INSERT", "UPDATE", "DELETE"],
            });
            uses.push(if leases_exist {
                "SELECT, INSERT, UPDATE and DELETE on rowclaim_leases".into()
            } else {
                "CREATE, to make rowclaim_leases".into()
            });
        }
        if m.lifecycle.is_none() && !recorded {
            let exists = self.table_exists(crate::registry::TABLE).await?;
            needs.push(Need {
                table: crate::registry::TABLE.into(),
                exists,
                privileges: &["SELECT", "INSERT"],
            });
            uses.push(if exists {
                format!("SELECT and INSERT on {}", crate::registry::TABLE)
            } else {
                format!("CREATE, to make {}", crate::registry::TABLE)
            });
        }
        let lacks = self.backend.inspect().missing_privileges(&needs).await?;
        if lacks.missing.is_empty() {
            return Ok(Finding::ok(
                Topic::Privileges,
                format!("this user has what claims need: {}", uses.join("; ")),
            ));
        }
        let what: Vec<&str> = lacks.missing.iter().map(|(w, _)| w.as_str()).collect();
        let mut grants: Vec<&str> = Vec::new();
        for grant in lacks.missing.iter().filter_map(|(_, g)| g.as_deref()) {
            // One CREATE grant makes both of rowclaim's tables.
            if !grants.contains(&grant) {
                grants.push(grant);
            }
        }
        let caveat = lacks.caveat.map(|c| format!(" ({c})")).unwrap_or_default();
        let finding = Finding::new(
            Topic::Privileges,
            Severity::Error,
            format!(
                "this user lacks what claims need: {}{caveat}; claims, or the first claim's \
                 record of the mapping, fail without it",
                what.join("; ")
            ),
        );
        Ok(if grants.is_empty() {
            finding
        } else {
            finding.fix(grants.join(" "))
        })
    }

    /// A claim refused for want of a privilege ([`crate::ErrorKind::PermissionDenied`]), explained as
    /// `check` would: which privilege on which table, and the GRANT that gives it (none when the
    /// catalog cannot tell). Any other error comes back as it was.
    pub(crate) async fn explain_denied(
        &self,
        m: &Mapping,
        strategy: Strategy,
        recorded: bool,
        e: Error,
    ) -> Error {
        let Error::Database(source) = e else {
            return e;
        };
        if source.db_kind() != Some(crate::error::DbKind::PermissionDenied) {
            return Error::Database(source);
        }
        let leases_exist = self.table_exists("rowclaim_leases").await.unwrap_or(true);
        match self
            .privileges_finding(m, strategy, recorded, leases_exist)
            .await
        {
            Ok(f) if f.severity == Severity::Error => Error::MissingPrivilege {
                what: f.message,
                grant: f.fix,
                source: Box::new(source),
            },
            _ => Error::MissingPrivilege {
                what: format!(
                    "this user lacks a privilege that claims on {} need",
                    m.table_display
                ),
                grant: None,
                source: Box::new(source),
            },
        }
    }

    /// The database's clock against this machine's, measured around one query.
    async fn clock_finding(&self) -> Result<Finding> {
        let local_ms = || {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        };
        let before = local_ms();
        let db = self.backend.inspect().clock_ms().await?;
        let after = local_ms();
        let skew = db - (before + after) / 2;
        let within = (after - before) / 2 + 1;
        let said = format!(
            "the database's clock is {:.3} s {} this machine's (± {:.3} s); leases are computed \
             by the database's clock alone, so no lease depends on it",
            skew.unsigned_abs() as f64 / 1000.0,
            if skew >= 0 { "ahead of" } else { "behind" },
            within as f64 / 1000.0
        );
        let apart = skew.abs() - within;
        Ok(if apart < SKEW_MENTION_MS {
            Finding::ok(Topic::Clock, said)
        } else {
            let severity = if apart < SKEW_WARN_MS {
                Severity::Advice
            } else {
                Severity::Warning
            };
            Finding::new(
                Topic::Clock,
                severity,
                format!(
                    "{said}, but lease times read against a local clock (yours, a worker's) \
                     mislead"
                ),
            )
            .fix("keep the clocks of the database server and of this machine in sync (NTP)")
        })
    }
}

/// What auto picks on this server for this mapping, and why, following the table's record as a
/// claimer's auto does.
fn auto_following(
    server: &ServerInfo,
    m: &Mapping,
    record: Option<&RecordedSource>,
) -> (Strategy, String) {
    let (auto, reason) = auto_choice(server, m);
    match record {
        Some(r) if crate::registry::follow_record(auto, Strategy::Auto, r) != auto => (
            crate::registry::follow_record(auto, Strategy::Auto, r),
            format!(
                "the table's record in rowclaim_sources keeps its claims in rowclaim_leases \
                 (recorded by a claimer with strategy {}), and every claimer must keep them \
                 where it does",
                r.strategy
            ),
        ),
        _ => (auto, reason),
    }
}

/// The strategy the checks are for (the one asked for, or auto's pick when that one cannot
/// run here), and the finding that says so.
fn strategy_finding(
    asked: Strategy,
    server: &ServerInfo,
    m: &Mapping,
    auto: Strategy,
    auto_reason: &str,
) -> Result<(Strategy, Finding)> {
    if asked == Strategy::Auto {
        let said = format!("auto picks {auto}: {auto_reason}");
        return Ok((auto, Finding::ok(Topic::Strategy, said)));
    }
    match asked.resolve(server, m) {
        Ok(s) => {
            let said = format!("{s}, as asked (auto would pick {auto}: {auto_reason})");
            Ok((s, Finding::ok(Topic::Strategy, said)))
        }
        Err(Error::UnsupportedStrategy { reason, .. }) => {
            let said = format!(
                "strategy {asked} cannot be used here: {reason}. The checks below are for \
                 auto's pick, {auto} ({auto_reason})"
            );
            let finding = Finding::new(Topic::Strategy, Severity::Error, said)
                .fix(format!("--strategy {auto} (or leave it to auto)"));
            Ok((auto, finding))
        }
        Err(e) => Err(e),
    }
}

/// The `claim-index` finding for a lookup's plan, with `fix` when an index would help.
fn index_verdict(m: &Mapping, l: &Lookup, fix: String) -> Finding {
    let plan = if l.plan.is_empty() {
        String::new()
    } else {
        format!(" (plan: {})", l.plan)
    };
    let note = l
        .note
        .as_ref()
        .map(|n| format!("; {n}"))
        .unwrap_or_default();
    let (t, order) = (&m.table_display, &m.order_by);
    let slow = |message: String| {
        let severity = if l.best_possible {
            Severity::Advice
        } else {
            Severity::Warning
        };
        let finding = Finding::new(Topic::ClaimIndex, severity, message);
        if l.best_possible {
            finding
        } else {
            finding.fix(fix.clone())
        }
    };
    match &l.reads {
        Reads::Index(index) => Finding::ok(
            Topic::ClaimIndex,
            format!(
                "the claim finds ready rows of {t} through index {index}, in the claim's order: \
                 it reads the rows it takes{plan}"
            ),
        ),
        Reads::Sorted(index) => slow(format!(
            "the claim {} and sorts them all by {order}, on every claim: the more rows wait, \
             the slower each claim{note}{plan}",
            match index {
                Some(i) => format!("finds the ready rows of {t} through index {i}"),
                None => format!("finds the ready rows of {t}"),
            }
        )),
        Reads::Walks(index) => slow(format!(
            "the claim walks index {index} of {t} in the claim's order past every row that is \
             not ready (done and failed ones too) to find ready ones: the more rows the table \
             keeps, the slower each claim{note}{plan}"
        )),
        Reads::Everything => slow(format!(
            "the claim reads every row of {t} to find ready ones: the bigger the table, the \
             slower each claim{note}{plan}"
        )),
        Reads::Unknown => Finding::new(
            Topic::ClaimIndex,
            Severity::Advice,
            format!("the claim's plan could not be judged{plan}"),
        ),
    }
}
