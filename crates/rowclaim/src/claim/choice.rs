//! Which strategy a claimer uses: `auto`'s choice for a server and a mapping, and the check that
//! a strategy asked for can run there.

use crate::backend::{Capability, ServerInfo};
use crate::error::{Error, Result};
use crate::mapping::Mapping;
use crate::strategy::Strategy;

impl Strategy {
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
