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

/// Work left in a source, from [`Claimer::backlog`].
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
