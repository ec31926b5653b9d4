//! How a claim is taken, what each way needs, and how `auto` chooses.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::backend::ServerInfo;
use crate::mapping::Mapping;
use crate::Capability;
use crate::{Error, Result};

/// How rows are claimed. See the crate docs for the SQL of each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Strategy {
    /// The best strategy the table and the server allow; [`crate::Claimer::strategy`] says which.
    Auto,
    /// One locking read that skips rows other claimers hold (`FOR UPDATE SKIP LOCKED`), then the
    /// claim is written to the owner and lease columns. PostgreSQL ≥ 9.5, MySQL ≥ 8.0.1,
    /// MariaDB ≥ 10.6. Needs owner and lease columns.
    SkipLocked,
    /// `UPDATE … SET owner = token … LIMIT n`, then read the rows that carry the token. Works
    /// everywhere; needs an owner column (and a lease column for crash recovery).
    Token,
    /// Read candidates without locks, then `UPDATE … WHERE id = ? AND status = ready`: whoever
    /// changes the row wins. Needs only the status column; uses owner/lease columns when mapped
    /// (without them, a crashed claimer's rows stay claimed and fencing is by status only).
    Optimistic,
    /// Leases live in a side table, `rowclaim_leases`, keyed by (source, row id); inserting the key
    /// is the claim and a key conflict means taken. Needs only the status column: the source
    /// table's schema is untouched.
    LeaseTable,
    /// `SELECT … FOR UPDATE SKIP LOCKED` in a transaction that stays open while the rows are
    /// processed; completing commits it. A crash frees the rows at once (the locks die with the
    /// session). The lease is the longest the session may stay idle. Only within one process:
    /// there is no token to complete from elsewhere. On SQLite one claimer holds the database's
    /// write lock at a time.
    Transaction,
}

impl Strategy {
    /// Every strategy, `auto` first.
    pub const ALL: [Strategy; 6] = [
        Strategy::Auto,
        Strategy::SkipLocked,
        Strategy::Token,
        Strategy::Optimistic,
        Strategy::LeaseTable,
        Strategy::Transaction,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Auto => "auto",
            Strategy::SkipLocked => "skip-locked",
            Strategy::Token => "token",
            Strategy::Optimistic => "optimistic",
            Strategy::LeaseTable => "lease-table",
            Strategy::Transaction => "transaction",
        }
    }

    /// Resolves `auto` and checks that the strategy can run on this server with this mapping.
    pub(crate) fn resolve(self, server: &ServerInfo, m: &Mapping) -> Result<Strategy> {
        let unsupported = |reason: String| Error::UnsupportedStrategy {
            strategy: self,
            reason,
        };
        match self {
            Strategy::Auto => Ok(auto_choice(server, m).0),
            Strategy::SkipLocked => {
                server.skip_locked().map_err(|why| {
                    unsupported(format!(
                        "{why}; use token (needs an owner column), lease-table or optimistic"
                    ))
                })?;
                if m.owner.is_none() || m.lease.is_none() {
                    return Err(unsupported(format!(
                        "it needs an owner column and a lease column on {}; map them with \
                         --owner-column and --lease-column, or use lease-table or transaction, \
                         which need only the status column",
                        m.table_display
                    )));
                }
                Ok(self)
            }
            Strategy::Token => {
                if m.owner.is_none() {
                    return Err(unsupported(format!(
                        "it needs an owner column on {} (text, 36 characters or more) to write \
                         the token into; map one with --owner-column, or use lease-table",
                        m.table_display
                    )));
                }
                Ok(self)
            }
            Strategy::Optimistic if m.lease.is_some() && m.owner.is_none() => {
                Err(unsupported(format!(
                    "with a lease column it needs an owner column on {} too: without one, a \
                     claimer whose lease expired cannot be told from the one that took the row \
                     over; map --owner-column, or drop --lease-column",
                    m.table_display
                )))
            }
            Strategy::Transaction if !server.supports(Capability::RowLocksSeenByAllWriters) => {
                Err(unsupported(format!(
                    "on {} a row lock is seen only by the node that took it, so rows locked for \
                     a job on one node could be claimed and run again on another; use auto \
                     (skip-locked on a table with owner and lease columns), token, optimistic \
                     or lease-table, whose claims are written to the table and checked when \
                     they commit",
                    server.description
                )))
            }
            Strategy::Optimistic | Strategy::LeaseTable | Strategy::Transaction => Ok(self),
        }
    }
}

/// What `auto` picks on this server for this mapping, and why, in words for a person (`rowclaim
/// check` shows them). Never `transaction`: its locks are the claim, and on a Galera cluster they
/// hold off one node's claimers only. What it picks writes its claim to the table, which the
/// cluster checks at commit.
pub(crate) fn auto_choice(server: &ServerInfo, m: &Mapping) -> (Strategy, String) {
    match (&m.owner, &m.lease) {
        (Some(_), Some(_)) => match server.skip_locked() {
            Ok(()) => (
                Strategy::SkipLocked,
                format!(
                    "owner and lease columns are mapped and {} has SKIP LOCKED",
                    server.description
                ),
            ),
            Err(why) => (
                Strategy::Token,
                format!("owner and lease columns are mapped, but {why}"),
            ),
        },
        // Without owner and lease columns only a side table gives both crash recovery and a
        // token that works across processes.
        (owner, _) => (
            Strategy::LeaseTable,
            format!(
                "{} has no {} mapped, so only a side table (rowclaim_leases) gives crash \
                 recovery and a token that works across processes",
                m.table_display,
                if owner.is_none() && m.lease.is_none() {
                    "owner or lease column"
                } else if owner.is_none() {
                    "owner column"
                } else {
                    "lease column"
                }
            ),
        ),
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Strategy {
    type Err = Error;

    fn from_str(s: &str) -> Result<Strategy> {
        Strategy::ALL
            .into_iter()
            .find(|st| st.name() == s)
            .ok_or_else(|| {
                Error::InvalidInput(format!(
                    "unknown strategy {s:?}: use one of auto, skip-locked, token, optimistic, lease-table, transaction"
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in Strategy::ALL {
            assert_eq!(s.name().parse::<Strategy>().unwrap(), s);
        }
        assert!("fastest".parse::<Strategy>().is_err());
    }
}
