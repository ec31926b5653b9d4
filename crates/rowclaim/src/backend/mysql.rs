//! placeholder
use super::*;
use crate::source::{Mapping, TableName};
use crate::value::IdList;
use crate::{Error, LockMode, LockWait, Result, RowId, Stats, Strategy};
use std::time::Duration;
#[derive(Clone, Debug)]
pub(crate) struct My {
    pool: sqlx::MySqlPool,
}
impl My {
    pub(crate) fn new(pool: sqlx::MySqlPool) -> Self {
        My { pool }
    }
}
fn no() -> Error {
    Error::Unsupported("not yet".into())
}
impl Driver for My {
    async fn server(&self) -> Result<ServerInfo> {
        let _ = &self.pool;
        Err(no())
    }
    async fn columns(&self, _t: &TableName) -> Result<Vec<Column>> {
        Err(no())
    }
    async fn ensure_lease_table(&self) -> Result<()> {
        Err(no())
    }
    async fn claim(&self, _a: &ClaimArgs<'_>) -> Result<Claimed> {
        Err(no())
    }
    async fn settle(
        &self,
        _m: &Mapping,
        _s: Strategy,
        _t: &str,
        _g: Target<'_>,
        _o: Outcome,
    ) -> Result<u64> {
        Err(no())
    }
    async fn extend(
        &self,
        _m: &Mapping,
        _s: Strategy,
        _t: &str,
        _g: Target<'_>,
        _l: Duration,
    ) -> Result<u64> {
        Err(no())
    }
    async fn still_held(
        &self,
        _m: &Mapping,
        _s: Strategy,
        _t: &str,
        _i: &IdList,
    ) -> Result<Vec<RowId>> {
        Err(no())
    }
    async fn held_settle(
        &self,
        _h: &mut Held,
        _m: &Mapping,
        _i: &IdList,
        _o: Outcome,
    ) -> Result<()> {
        Err(no())
    }
    async fn held_extend(&self, _h: &mut Held, _l: Duration) -> Result<()> {
        Err(no())
    }
    async fn lock_rows(
        &self,
        _m: &Mapping,
        _i: Option<&IdList>,
        _l: Option<u32>,
        _mo: LockMode,
        _w: LockWait,
    ) -> Result<(Held, Vec<serde_json::Value>)> {
        Err(no())
    }
    async fn counter_next(&self, _n: &str) -> Result<i64> {
        Err(no())
    }
    async fn stats(&self, _m: &Mapping, _s: Strategy) -> Result<Stats> {
        Err(no())
    }
}
