//! The inspect role (`rowclaim check`): what a driver can tell about how claims would fare on its
//! server, without claiming or writing anything. Each driver implements it in its `check.rs`,
//! beside its claim SQL; `crate::check` turns the answers into a report.

use crate::error::Result;
use crate::mapping::{Column, Mapping};
use crate::report::Finding;
use crate::strategy::Strategy;

use super::Resolved;

/// How the statement that finds ready rows reads the source table, from the server's plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Lookup {
    pub reads: Reads,
    /// The plan in the server's words, shortened to the steps on the source table.
    pub plan: String,
    /// What the driver adds about its server (e.g. that a locking read that sorts locks every
    /// row it sorts).
    pub note: Option<String>,
    /// The server can do no better for this statement than what it does (a sort, say): the
    /// finding is advice, not a warning.
    pub best_possible: bool,
}

/// How the lookup reads the source table, worst last.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Reads {
    /// The plan shows no step on the source table that could be told apart (a shape of plan
    /// this version of rowclaim does not know).
    Unknown,
    /// Through this index, which holds only (or starts with) the rows the claim looks for, in
    /// the claim's order: it reads the rows it takes and few more.
    Index(String),
    /// Through this index (or none) to the rows the claim looks for, then sorts all of them
    /// into the claim's order, on every claim.
    Sorted(Option<String>),
    /// Walks this index in the claim's order past every row that is not claimable.
    Walks(String),
    /// Reads the whole table.
    Everything,
}

/// What a claim needs of one table: these privileges on it, or, when it does not exist yet, the
/// right to create it (rowclaim's own tables are made at first use).
#[derive(Clone, Debug)]
pub(crate) struct Need {
    /// A source table's catalog key (`schema.table`), or one of rowclaim's tables by name.
    pub table: String,
    pub exists: bool,
    pub privileges: &'static [&'static str],
}

/// What a user lacks of what claims need.
#[derive(Clone, Debug, Default)]
pub(crate) struct Privileges {
    /// Each privilege missing, said as a phrase (`UPDATE on public.jobs`), with the statement
    /// that grants it where there is one.
    pub missing: Vec<(String, Option<String>)>,
    /// What the look could not see (privileges through roles, say), when something is missing.
    pub caveat: Option<&'static str>,
}

/// The inspect role: see the module docs.
#[async_trait::async_trait]
pub(crate) trait Inspect: Send + Sync {
    /// Plans the statement a claim of `strategy` finds ready rows with (`EXPLAIN`: nothing runs,
    /// nothing is locked). Without `leases`, the lease-table strategy's statement leaves out
    /// `rowclaim_leases`, which does not exist yet.
    async fn explain_lookup(&self, m: &Mapping, strategy: Resolved, leases: bool)
        -> Result<Lookup>;
    /// The `CREATE INDEX` statement that serves that lookup in this dialect.
    fn lookup_index(&self, m: &Mapping, strategy: Resolved) -> String;
    /// Plans the statement a claim finds rows whose lease expired with (the expired arm, see
    /// `sql::expired_lookup`); `None` where `m` has no lease column. Claimed rows are few, so
    /// an index that holds (or is searched by) them serves it even when it sorts them.
    async fn explain_expired(&self, m: &Mapping) -> Result<Option<Lookup>>;
    /// The `CREATE INDEX` statement that serves that lookup in this dialect.
    fn expired_index(&self, m: &Mapping) -> String;
    /// The server's settings that matter to claims of `strategy` on `m`, as findings (read-only
    /// server or standby, default isolation, binary log, cluster, pooler, lease column type).
    async fn settings(
        &self,
        m: &Mapping,
        strategy: Strategy,
        columns: &[Column],
    ) -> Result<Vec<Finding>>;
    /// Which of the needs this connection's user lacks; none when it has them all.
    async fn missing_privileges(&self, needs: &[Need]) -> Result<Privileges>;
    /// The database's clock (the lease clock), in milliseconds since the Unix epoch.
    async fn clock_ms(&self) -> Result<i64>;
}

/// Collects what a plan says about the source table and gives the worst of it.
#[derive(Debug, Default)]
pub(crate) struct Judge {
    worst: Option<Reads>,
    sorted: bool,
    steps: Vec<String>,
}

impl Judge {
    /// One step of the plan, in the server's words, kept for the message.
    pub(crate) fn step(&mut self, text: impl Into<String>) {
        self.steps.push(text.into());
    }

    /// The table is read this way by one step.
    pub(crate) fn reads(&mut self, how: Reads) {
        if self.worst.as_ref().is_none_or(|w| how > *w) {
            self.worst = Some(how);
        }
    }

    /// The rows are sorted after they are read.
    pub(crate) fn sorts(&mut self) {
        self.sorted = true;
    }

    pub(crate) fn lookup(self) -> Lookup {
        let reads = match self.worst {
            None => Reads::Unknown,
            Some(Reads::Index(i)) if self.sorted => Reads::Sorted(Some(i)),
            Some(w) => w,
        };
        Lookup {
            reads,
            plan: self.steps.join("; "),
            note: None,
            best_possible: false,
        }
    }
}

/// Whether `text` (a condition or index definition in the server's words) names `column`, as a
/// word of its own, in any case and with or without quotes.
pub(crate) fn mentions(text: &str, column: &str) -> bool {
    let text = text.to_ascii_lowercase();
    let column = column.to_ascii_lowercase();
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(&column).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + column.len()..].chars().next();
        !before.is_some_and(word) && !after.is_some_and(word)
    })
}

/// A quoted identifier (`"status"`, `` `status` ``) as the catalog spells it.
pub(crate) fn unquoted(quoted: &str) -> String {
    quoted.trim_matches(|c| c == '"' || c == '`').to_owned()
}

/// The columns of an index for a claim's lookup: `first` (the status column, where the
/// dialect has no partial indexes), then the claim's order (`"col" ASC, …`, as the mapping
/// holds it) without `first`.
pub(crate) fn index_columns(m: &Mapping, first: Option<&str>) -> String {
    let mut cols: Vec<String> = first.map(str::to_owned).into_iter().collect();
    cols.extend(
        m.order_by
            .split(", ")
            .filter(|part| first.is_none_or(|f| !part.starts_with(f)))
            .map(str::to_owned),
    );
    cols.join(", ")
}

/// A name for the index that serves claims on `m` (at most 63 characters, a plain name).
pub(crate) fn index_name(m: &Mapping, strategy: Resolved) -> String {
    let table = m
        .table_display
        .rsplit('.')
        .next()
        .unwrap_or(&m.table_display);
    let what = match strategy {
        Resolved::LeaseTable => "claimable",
        _ => "ready",
    };
    named(table, what)
}

/// A name for the index that serves the look at expired leases on `m`.
pub(crate) fn expired_index_name(m: &Mapping) -> String {
    let table = m
        .table_display
        .rsplit('.')
        .next()
        .unwrap_or(&m.table_display);
    named(table, "claimed")
}

fn named(table: &str, what: &str) -> String {
    let mut name = format!("{table}_rowclaim_{what}");
    name.truncate(63);
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mentions_whole_words_only() {
        assert!(mentions("((status)::text = 'ready'::text)", "status"));
        assert!(mentions("t.`Status` = 'ready'", "status"));
        assert!(!mentions("t.`status_at` < now()", "status"));
        assert!(!mentions("(my_status = 1)", "status"));
    }

    #[test]
    fn the_worst_step_counts() {
        let mut j = Judge::default();
        j.reads(Reads::Index("a".into()));
        j.reads(Reads::Walks("pk".into()));
        assert_eq!(j.lookup().reads, Reads::Walks("pk".into()));
        let mut j = Judge::default();
        j.reads(Reads::Index("a".into()));
        j.sorts();
        assert_eq!(j.lookup().reads, Reads::Sorted(Some("a".into())));
        assert_eq!(Judge::default().lookup().reads, Reads::Unknown);
    }
}
