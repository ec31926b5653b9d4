//! Looking at a source's rows as they are stored, and giving a held row back by hand: what a
//! dashboard or an operator needs, apart from claiming.

use std::time::SystemTime;

use crate::backend::{retry_transient, Outcome, RowQuery};
use crate::claim::Claimer;
use crate::error::{Error, Result};
use crate::id::RowId;

/// Which rows [`Claimer::rows`] returns: all of them unless narrowed, in id order, at most 50.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RowFilter {
    /// Only rows whose status column holds this value.
    pub status: Option<String>,
    /// Only rows whose id sorts after this one: the next page after a page ending there.
    pub after: Option<String>,
    /// At most this many (50 unless set).
    pub limit: Option<u32>,
}

impl RowFilter {
    /// All rows, at most 50.
    pub fn new() -> RowFilter {
        RowFilter::default()
    }

    /// Only rows in `status` (a status value of the source, e.g. its claimed value).
    pub fn status(mut self, status: impl Into<String>) -> Self {
        self.status = Some(status.into());
        self
    }

    /// Only rows whose id sorts after `id` (given as text, as in a URL).
    pub fn after(mut self, id: impl Into<String>) -> Self {
        self.after = Some(id.into());
        self
    }

    /// At most `n` rows.
    pub fn limit(mut self, n: u32) -> Self {
        self.limit = Some(n);
        self
    }
}

/// A row of a source as stored, with who holds it: from [`Claimer::rows`] and [`Claimer::row`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct SourceRow {
    /// The row's id.
    pub id: RowId,
    /// Its status value, as text.
    pub status: String,
    /// The token of the claim that holds it: from the owner column, or for a source whose
    /// claims are kept in `rowclaim_leases`, from there. `None` when no claim holds it (or the
    /// mapping has no owner column).
    pub owner: Option<String>,
    /// When that claim's lease ends (by the database's clock); `None` without a lease.
    pub lease_until: Option<SystemTime>,
    /// The row's columns as a JSON object.
    pub data: serde_json::Value,
}

impl Claimer {
    /// Rows of the source as stored, in id order, with their status, holder and lease: for
    /// looking at a table, not for working on it (nothing is claimed or locked).
    pub async fn rows(&self, filter: &RowFilter) -> Result<Vec<SourceRow>> {
        let m = self.mapping();
        let status_kind = match m.ready {
            RowId::Int(_) => crate::value::Kind::Int,
            RowId::Text(_) => crate::value::Kind::Text,
        };
        let q = RowQuery {
            status: filter
                .status
                .as_deref()
                .map(|s| status_kind.parse(s, "status value"))
                .transpose()?,
            id: None,
            after: filter
                .after
                .as_deref()
                .map(|a| m.id_kind.parse(a, "row id"))
                .transpose()?,
            limit: i64::from(filter.limit.unwrap_or(50)),
        };
        self.look(&q).await
    }

    /// One row of the source by id, as [`Claimer::rows`] shows it; `None` when there is none.
    pub async fn row(&self, id: &RowId) -> Result<Option<SourceRow>> {
        let q = RowQuery {
            status: None,
            id: Some(id.clone()),
            after: None,
            limit: 1,
        };
        Ok(self.look(&q).await?.into_iter().next())
    }

    /// How many of the rows `ids` ended done ([`Claimer::shows`], whoever finished them). One
    /// look per row: for the few rows a worker let go, not for a table.
    pub(crate) async fn ended_done(&self, ids: &[RowId]) -> Result<u64> {
        let mut n = 0;
        for id in ids {
            n += u64::from(self.shows(id, &Outcome::Done(None), None).await?);
        }
        Ok(n)
    }

    /// Whether the row `id` ended as `outcome` (done or failed; not outcomes that give it back):
    /// its status is that outcome's, with `owner`'s token still in its owner column when one is
    /// named (a settle keeps it there); or, done where done rows are deleted, it is gone.
    pub(crate) async fn shows(
        &self,
        id: &RowId,
        outcome: &Outcome,
        owner: Option<&str>,
    ) -> Result<bool> {
        if !matches!(outcome, Outcome::Done(_) | Outcome::Failed(_)) {
            return Ok(false);
        }
        let m = self.mapping();
        Ok(match self.row(id).await? {
            Some(row) => {
                row.status == outcome.status(m).to_string()
                    && owner.is_none_or(|o| row.owner.as_deref() == Some(o))
            }
            None => outcome.deletes(m),
        })
    }

    /// Gives the claimed row `id` back: ready again, its owner and lease cleared; for a source
    /// whose claims are kept in `rowclaim_leases`, its lease there is removed. With `holder`
    /// (a claim token, as [`SourceRow::owner`] showed it), only while that claim still holds the
    /// row: an operator who saw one holder never throws out another that took the row since.
    /// The holder is fenced out: whatever it later does with the row by its token is refused
    /// with [`Error::LeaseLost`]. Only rows the source's filter lets through are released.
    /// Returns whether a row was given back.
    ///
    /// Refused ([`Error::Unsupported`]) for the transaction strategy, whose rows are held by
    /// the claiming process's open transaction, and for a source with neither an owner column
    /// nor the lease table: there is no token to fence the holder out by, so its later result
    /// would land on the row after another worker claimed it. A row locked by an open
    /// transaction (a `transaction` claimer of the same table) fails at once with
    /// [`Error::Locked`] on PostgreSQL and MySQL/MariaDB, instead of waiting for it.
    pub async fn release_row(&self, id: &RowId, holder: Option<&str>) -> Result<bool> {
        let m = self.mapping();
        if m.owner.is_none() && self.strategy() != crate::strategy::Strategy::LeaseTable {
            return Err(Error::Unsupported(format!(
                "{} has no owner column, so its holder cannot be fenced out: a row given back \
                 now could be finished by its old holder after another worker claimed it; map \
                 an owner column (--owner-column), or let the holder settle it",
                m.table_display
            )));
        }
        // An id of the wrong kind would otherwise be a database error about a cast.
        let id = m.id_kind.parse(&id.to_string(), "row id")?;
        let changed = retry_transient!(
            self.db()
                .backend
                .store()
                .release_row(m, self.strategy(), &id, holder)
                .await
        )?;
        Ok(changed > 0)
    }

    async fn look(&self, q: &RowQuery) -> Result<Vec<SourceRow>> {
        let m = self.mapping();
        let found = retry_transient!(self.db().backend.store().rows(m, self.strategy(), q).await)?;
        found
            .into_iter()
            .map(|(data, status, owner, lease_ms)| {
                let id = data
                    .get(&m.id_name)
                    .and_then(|v| m.id_kind.id_from_json(v))
                    .ok_or_else(|| {
                        Error::Internal(format!("a row of {} has no usable id", m.table_display))
                    })?;
                Ok(SourceRow {
                    id,
                    status: status.unwrap_or_default(),
                    owner,
                    lease_until: lease_ms.map(crate::value::at_ms),
                    data,
                })
            })
            .collect()
    }
}
