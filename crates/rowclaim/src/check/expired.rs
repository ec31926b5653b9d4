//! The claim's other lookup: rows whose lease expired (claimed, their lease ended), which a
//! claim of the skip-locked, token and optimistic strategies looks for beside the ready rows,
//! at least once a second per claimer while it is busy. Without an index over claimed rows it
//! reads the whole table each time, however well the ready rows are indexed.

use crate::backend::{Lookup, Reads, Resolved};
use crate::db::Db;
use crate::error::Result;
use crate::mapping::Mapping;
use crate::report::{Finding, Severity, Topic};

impl Db {
    /// Whether the look at expired leases reads claimed rows through an index; `None` when the
    /// claims make no such look (no lease column; the lease-table strategy, whose lookup of
    /// ready rows covers them; the transaction strategy, which keeps no lease in the table).
    pub(super) async fn expired_finding(
        &self,
        m: &Mapping,
        strategy: Resolved,
    ) -> Result<Option<Finding>> {
        if !matches!(
            strategy,
            Resolved::SkipLocked | Resolved::Token | Resolved::Optimistic
        ) {
            return Ok(None);
        }
        let lookup = match self.backend.inspect().explain_expired(m).await {
            Ok(Some(l)) => l,
            Ok(None) => return Ok(None),
            Err(e) if e.is_connection() => return Err(e),
            Err(e) => {
                return Ok(Some(Finding::new(
                    Topic::ExpiredLeaseIndex,
                    Severity::Advice,
                    format!("the look at expired leases could not be explained: {e}"),
                )))
            }
        };
        let fix = match &m.lifecycle {
            // The indexes of a table a layer above owns are that layer's to make.
            Some(l) => l.index_fix.to_owned(),
            None => self.backend.inspect().expired_index(m),
        };
        Ok(Some(expired_verdict(m, &lookup, fix)))
    }
}

/// What the plan of the look at expired leases says. An index that holds the claimed rows (or
/// is searched by status) serves it even when it sorts them: few rows are claimed at a time.
fn expired_verdict(m: &Mapping, l: &Lookup, fix: String) -> Finding {
    let t = &m.table_display;
    let plan = if l.plan.is_empty() {
        String::new()
    } else {
        format!(" (plan: {})", l.plan)
    };
    let slow = |how: String| {
        Finding::new(
            Topic::ExpiredLeaseIndex,
            Severity::Warning,
            format!(
                "the claim's look at rows whose lease expired (claimed, their lease ended) \
                 {how}, at least once a second per busy claimer: the bigger the table, the \
                 slower each claim that looks{plan}"
            ),
        )
        .fix(fix.clone())
    };
    match &l.reads {
        Reads::Index(index) | Reads::Sorted(Some(index)) => Finding::ok(
            Topic::ExpiredLeaseIndex,
            format!(
                "the claim finds rows of {t} whose lease expired through index {index}: it \
                 reads the claimed rows only{plan}"
            ),
        ),
        Reads::Walks(index) => slow(format!(
            "walks index {index} of {t} past every row that is not claimed"
        )),
        Reads::Everything | Reads::Sorted(None) => slow(format!("reads every row of {t}")),
        Reads::Unknown => Finding::new(
            Topic::ExpiredLeaseIndex,
            Severity::Advice,
            format!("the plan of the look at expired leases could not be judged{plan}"),
        ),
    }
}
