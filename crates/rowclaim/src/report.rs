//! What rowclaim reports about a source: its row counts ([`Stats`]), and what a check found
//! ([`Finding`]): how much it matters and what it is about. The drivers
//! make findings about their servers (`backend/*/check.rs`), the claim core about a source
//! (`crate::check`); both stand on this.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

/// How much a [`Finding`] matters, least first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Severity {
    /// As it should be.
    Ok,
    /// Worth knowing; nothing to fix for claims to work well.
    Advice,
    /// Claims work, and stay exclusive, but slower than they could (a claim without a fitting
    /// index, a default isolation that makes claims fail and retry).
    Warning,
    /// Claims fail, or may not stay exclusive: a read-only server, missing privileges, a binary
    /// log claims cannot be written to, a strategy the server cannot do, a mapping that differs
    /// from the table's recorded one.
    Error,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Ok => "ok",
            Severity::Advice => "advice",
            Severity::Warning => "warning",
            Severity::Error => "error",
        })
    }
}

/// What a [`Finding`] is about: its stable machine name (`claim-index`, …).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Topic {
    /// The strategy claims would use, what `auto` picks and why, or why the one asked for
    /// cannot run here.
    Strategy,
    /// The table's mapping against the one its first claim recorded (`rowclaim_sources`).
    Registry,
    /// Whether the id column names one row (a primary key or a unique index of its own).
    IdColumn,
    /// Whether the statement that finds ready rows reads them through an index.
    ClaimIndex,
    /// Whether the claim's look at rows whose lease expired (claimed rows, their lease
    /// ended) reads them through an index.
    ExpiredLeaseIndex,
    /// What the connection's user may do to the tables claims touch.
    Privileges,
    /// Whether the server takes writes (not a standby or read-only replica).
    Writable,
    /// The default transaction isolation.
    Isolation,
    /// MySQL/MariaDB: the binary log's format.
    Binlog,
    /// MySQL/MariaDB: whether the server is a node of a Galera cluster.
    Galera,
    /// PostgreSQL: a transaction-mode pooler in between.
    Pooler,
    /// MySQL/MariaDB: the lease column's type, and the time zone its times are in.
    LeaseColumn,
    /// The database's clock against this machine's, and how lease times are kept.
    Clock,
}

impl Topic {
    /// The stable name, as `--json` prints it.
    pub fn name(self) -> &'static str {
        match self {
            Topic::Strategy => "strategy",
            Topic::Registry => "registry",
            Topic::IdColumn => "id-column",
            Topic::ClaimIndex => "claim-index",
            Topic::ExpiredLeaseIndex => "expired-lease-index",
            Topic::Privileges => "privileges",
            Topic::Writable => "writable",
            Topic::Isolation => "isolation",
            Topic::Binlog => "binlog",
            Topic::Galera => "galera",
            Topic::Pooler => "pooler",
            Topic::LeaseColumn => "lease-column",
            Topic::Clock => "clock",
        }
    }
}

impl fmt::Display for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One thing [`crate::Db::check`] found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Finding {
    /// What it is about.
    #[serde(rename = "name")]
    pub topic: Topic,
    /// How much it matters.
    pub severity: Severity,
    /// What was found, in a sentence or two.
    pub message: String,
    /// What to do about it, when there is something to do: a statement to run (the exact
    /// `CREATE INDEX` for this database), a setting to change.
    pub fix: Option<String>,
}

impl Finding {
    pub(crate) fn new(topic: Topic, severity: Severity, message: impl Into<String>) -> Finding {
        Finding {
            topic,
            severity,
            message: message.into(),
            fix: None,
        }
    }

    pub(crate) fn ok(topic: Topic, message: impl Into<String>) -> Finding {
        Finding::new(topic, Severity::Ok, message)
    }

    pub(crate) fn fix(mut self, fix: impl Into<String>) -> Finding {
        self.fix = Some(fix.into());
        self
    }
}

/// Row counts of a source, as `rowclaim stats` shows them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Stats {
    /// Rows per status value (all rows of the table that pass the source's filter).
    pub by_status: BTreeMap<String, u64>,
    /// Claimed rows per owner token.
    pub claimed_by_owner: BTreeMap<String, u64>,
    /// Claimed rows whose lease has expired (claimable again).
    pub expired_leases: u64,
}
