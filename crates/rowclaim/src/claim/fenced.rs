//! Fenced changes by token: complete, fail, release and extend rows a claim's token holds, from
//! anywhere (`rowclaim complete --token …`); each is conditional on the token, and a short count
//! names the rows the token lost.

use super::*;
use crate::backend::Target;

/// A fenced change to rows a token holds.
#[derive(Clone)]
pub(super) enum Change {
    Settle(Outcome),
    Extend(Duration),
}

impl Change {
    pub(super) fn verb(&self) -> &'static str {
        match self {
            Change::Settle(Outcome::Done(_)) => "complete",
            Change::Settle(Outcome::Failed(_)) => "fail",
            Change::Settle(Outcome::Ready | Outcome::Unstarted) => "release",
            Change::Settle(Outcome::Retry { .. }) => "retry",
            Change::Settle(Outcome::Snooze { .. }) => "snooze",
            Change::Extend(_) => "extend",
        }
    }
}

impl Claimer {
    /// Marks rows `token` holds as done. `ids` empty means all rows the token holds.
    /// Returns how many rows changed; [`Error::LeaseLost`] (and no change) if the token no longer
    /// holds one of them.
    pub async fn complete(&self, token: &Token, ids: &[RowId]) -> Result<u64> {
        self.settle(token, ids, Outcome::Done(None)).await
    }

    /// Marks rows `token` holds as failed. See [`Claimer::complete`].
    pub async fn fail(&self, token: &Token, ids: &[RowId]) -> Result<u64> {
        self.settle(token, ids, Outcome::Failed(None)).await
    }

    /// Gives rows `token` holds back: ready to be claimed again. See [`Claimer::complete`].
    pub async fn release(&self, token: &Token, ids: &[RowId]) -> Result<u64> {
        self.settle(token, ids, Outcome::Ready).await
    }

    /// Pushes the lease of rows `token` holds to now + `lease` (database clock).
    pub async fn extend(&self, token: &Token, ids: &[RowId], lease: Duration) -> Result<u64> {
        check_lease(lease)?;
        let i = &self.inner;
        if i.strategy != Strategy::LeaseTable && i.m.lease.is_none() {
            return Err(Error::Unsupported(format!(
                "{} has no lease column mapped, so its claims do not expire and cannot be extended",
                i.m.table_display
            )));
        }
        self.fenced(token, ids, Change::Extend(lease)).await
    }

    pub(super) async fn settle(
        &self,
        token: &Token,
        ids: &[RowId],
        outcome: Outcome,
    ) -> Result<u64> {
        self.fenced(token, ids, Change::Settle(outcome)).await
    }

    /// Runs a fenced change; a short count becomes `LeaseLost` naming the rows the token lost.
    async fn fenced(&self, token: &Token, ids: &[RowId], change: Change) -> Result<u64> {
        self.check_by_token(change.verb())?;
        let i = &self.inner;
        let (b, t) = (i.db.backend.store(), token.to_string());
        let lost = |ids: Vec<RowId>| Error::LeaseLost {
            token: t.clone(),
            ids,
        };
        // A row named twice counts once (so the count check below stays exact).
        let mut seen = HashSet::with_capacity(ids.len());
        let unique: Vec<RowId> = ids.iter().filter(|id| seen.insert(*id)).cloned().collect();
        let ids = unique.as_slice();
        let list = if ids.is_empty() {
            None
        } else {
            Some(IdList::new(i.m.id_kind, ids)?)
        };
        let target = || match &list {
            None => Target::All,
            Some(l) => Target::Ids(l, ids.len()),
        };
        let n = retry_transient!(match &change {
            Change::Settle(o) => b.settle(&i.m, i.strategy, &t, target(), o.clone()).await,
            Change::Extend(lease) => b.extend(&i.m, i.strategy, &t, target(), *lease).await,
        })
        .map_err(|e| unknown_if_cut(e, change.verb(), ids.len()))?;
        match &list {
            None if n == 0 => Err(lost(vec![])),
            Some(l) if n as usize != ids.len() => {
                let held = b.still_held(&i.m, i.strategy, &t, l).await?;
                Err(lost(
                    ids.iter()
                        .filter(|id| !held.contains(id))
                        .cloned()
                        .collect(),
                ))
            }
            _ => Ok(n),
        }
    }

    fn check_by_token(&self, op: &str) -> Result<()> {
        let i = &self.inner;
        if i.strategy == Strategy::Transaction {
            return Err(Error::Unsupported(format!(
                "the transaction strategy keeps its rows in the claiming process's open \
                 transaction, so a token cannot {op} them from elsewhere; use the Claim itself \
                 (rowclaim work), or another strategy"
            )));
        }
        Ok(())
    }
}

/// A statement that was sent, and whose connection broke before the answer, may have been
/// carried out: that is [`Error::OutcomeUnknown`], not a plain failure.
pub(super) fn unknown_if_cut(e: Error, verb: &str, rows: usize) -> Error {
    match e {
        Error::Database(d) if d.may_have_happened() => Error::OutcomeUnknown {
            what: match rows {
                0 => format!("the {verb} of the token's rows"),
                1 => format!("the {verb} of 1 row"),
                n => format!("the {verb} of {n} rows"),
            },
            source: d,
        },
        other => other,
    }
}

pub(super) fn check_lease(lease: Duration) -> Result<()> {
    if lease.is_zero() {
        return Err(Error::InvalidInput(
            "lease must be longer than zero (e.g. 30s)".into(),
        ));
    }
    Ok(())
}
