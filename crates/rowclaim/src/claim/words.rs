//! The values a claim hands out: its rows, and the work left in a source.

use serde::{Deserialize, Serialize};

use crate::id::RowId;

/// One claimed row: its id and all its columns as a JSON object (as they are after the claim).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClaimedRow {
    /// The row's id.
    pub id: RowId,
    /// The row as a JSON object, column name → value.
    pub data: serde_json::Value,
}

impl ClaimedRow {
    /// The row as a struct of yours, read with serde from its columns (a field per column, by
    /// name; columns the struct has no field for are left out, so the mapping's status, owner
    /// and lease columns need none). A column that does not fit its field is an
    /// [`Error::Shape`](crate::Error::Shape) naming the row, the type and the column.
    ///
    /// The columns come as each database writes them as JSON: numbers and text as such,
    /// booleans as `true`/`false` on PostgreSQL but `0`/`1` on MySQL/MariaDB and SQLite, times
    /// as text on PostgreSQL and MySQL/MariaDB (and as the column holds them on SQLite).
    ///
    /// ```
    /// use rowclaim::{ClaimedRow, RowId};
    /// #[derive(serde::Deserialize)]
    /// struct Email {
    ///     address: String,
    /// }
    /// let row = ClaimedRow {
    ///     id: RowId::Int(1),
    ///     data: serde_json::json!({"id": 1, "address": "ada@example.com", "status": "claimed"}),
    /// };
    /// assert_eq!(row.data_as::<Email>()?.address, "ada@example.com");
    /// # Ok::<(), rowclaim::Error>(())
    /// ```
    pub fn data_as<T: serde::de::DeserializeOwned>(&self) -> crate::error::Result<T> {
        crate::shape::from_json(&self.data, || {
            format!(
                "row {} does not read as {}",
                self.id,
                crate::shape::type_name::<T>()
            )
        })
    }
}

/// Rows that run one after another, at most `width` at once, in the order given: a layer above
/// claims a line of rows ahead that must not all run at once (the managed queue: a run of jobs
/// of one limit key, each of the key's jobs the claim took). The worker runtime keeps to it,
/// and gives back unstarted the rows behind one that went back unfinished (a retry keeps its
/// place in its line). Lines of one name are one line: the rows of a later claim join the line
/// behind those the worker holds (the line's next run, `Claimer::claim_behind`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Line {
    /// What the line is (the managed queue: its queue and a number of its key, which two keys
    /// may share: their jobs then run one after another, never more at once).
    pub name: std::sync::Arc<str>,
    /// How many of its rows may run at once.
    pub width: u32,
    /// Its rows, in the order they start.
    pub rows: Vec<RowId>,
}

/// Work left in a source, from [`Claimer::backlog`](crate::Claimer::backlog).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Backlog {
    /// Rows in the ready state.
    pub ready: u64,
    /// Rows claimed now.
    pub claimed: u64,
    /// Managed queue: ready jobs scheduled for later that never ran (not counted in `ready`).
    pub scheduled: u64,
    /// Whether claimed rows come back when their claimer dies (a lease column is mapped, or the
    /// strategy is lease-table). Without that, a claimed row stays claimed until someone settles it.
    pub claims_expire: bool,
}

impl Backlog {
    /// Whether any row may still need a worker: ready rows, or claimed rows that come back if their
    /// claimer dies.
    pub fn has_work(&self) -> bool {
        self.ready > 0 || (self.claims_expire && self.claimed > 0)
    }
}
