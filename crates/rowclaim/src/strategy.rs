//! How a claim is taken: the strategies (what each needs, and how `auto` chooses, is the claim
//! core's: `claim/choice.rs`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

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
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Strategy {
    type Err = UnknownStrategy;

    fn from_str(s: &str) -> Result<Strategy, UnknownStrategy> {
        Strategy::ALL
            .into_iter()
            .find(|st| st.name() == s)
            .ok_or_else(|| UnknownStrategy(s.to_owned()))
    }
}

/// A strategy name that is none of rowclaim's (from [`Strategy`]'s `FromStr`); it converts into
/// [`crate::Error::InvalidInput`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown strategy {0:?}: use one of auto, skip-locked, token, optimistic, lease-table, transaction"
)]
pub struct UnknownStrategy(pub String);

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
