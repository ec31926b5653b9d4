//! The SQL every driver sends, as snapshots (`insta`), built by the statement builders alone: no
//! database server is involved. For each database, strategy and mapping shape: the statements of
//! one claim of two rows, of a complete of one of them and a release of the other, and of a row
//! given back by hand; each statement followed by the values it binds. A change to any of them
//! shows up as a diff of `claim/snapshots/*.snap` in review; `cargo insta review` (or
//! `INSTA_UPDATE=always cargo test -p rowclaim --lib snapshots`) accepts it. The managed queue's
//! statements have snapshots of their own (`queue/snapshots.rs`).

use std::time::Duration;

use crate::backend::sql::{naming, Dialect, Stmt};
use crate::backend::{ClaimArgs, Outcome, Resolved, ServerInfo, ServerKind, Target};
use crate::error::Result;
use crate::id::RowId;
use crate::mapping::{ColType, Column, Mapping};
use crate::source::Source;
use crate::strategy::Strategy;
use crate::value::IdList;

/// What a case's table holds besides id and status.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Shape {
    /// `id`, `status`: the least a source needs.
    StatusOnly,
    /// Owner, lease and attempts columns too.
    Full,
}

const STRATEGIES: [Strategy; 5] = [
    Strategy::SkipLocked,
    Strategy::Token,
    Strategy::Optimistic,
    Strategy::LeaseTable,
    Strategy::Transaction,
];

/// The claims' token in every snapshot.
pub(crate) const TOKEN: &str = "01900000-0000-7000-8000-000000000000";

/// A column as a catalog would report it.
pub(crate) fn column(name: &str, sql_type: &str, ty: ColType) -> Column {
    Column {
        name: name.to_owned(),
        sql_type: sql_type.to_owned(),
        ty,
    }
}

/// The mapping of `source` over `columns`, as dialect `D` checks it (table key `public.jobs`).
pub(crate) fn mapping<D: Dialect>(source: &Source, columns: &[Column]) -> Mapping {
    match source.check(&naming::<D>(), columns, "public.jobs".to_owned()) {
        Ok(m) => m,
        Err(e) => panic!("the snapshot's source does not check: {e}"),
    }
}

/// The harness table of `shape` in dialect `D`.
fn table<D: Dialect>(shape: Shape) -> Mapping {
    let mut columns = vec![
        column("id", "bigint", ColType::Int),
        column("status", "varchar(20)", ColType::Text { max_len: Some(20) }),
    ];
    let mut source = Source::new("jobs");
    if let Shape::Full = shape {
        columns.extend([
            column("owner", "varchar(64)", ColType::Text { max_len: Some(64) }),
            column("lease_until", D::LEASE_TYPE, D::LEASE_COLUMN),
            column("attempts", "integer", ColType::Int),
        ]);
        source = source
            .owner_column("owner")
            .lease_column("lease_until")
            .attempts_column("attempts");
    }
    mapping::<D>(&source, &columns)
}

/// A claim's request for two rows of `m` with `strategy`, looking at expired leases too.
pub(crate) fn claim_args(m: &Mapping, strategy: Strategy) -> ClaimArgs<'_> {
    ClaimArgs {
        m,
        strategy: Resolved::of(strategy).unwrap_or(Resolved::Token),
        batch: 2,
        lease: Duration::from_secs(60),
        token: TOKEN,
        expired: true,
        arms: None,
        committed: None,
    }
}

/// Statements as a snapshot shows them: each one's SQL, then the values it binds.
pub(crate) fn show<D: Dialect>(statements: impl IntoIterator<Item = Stmt<D>>) -> String {
    statements
        .into_iter()
        .map(|s| format!("{};\n-- binds: {:?}", s.sql.trim(), s.binder.values()))
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// One driver's statement builders, as the snapshots call them.
pub(crate) trait Builders {
    type D: Dialect;
    /// The server the snapshots are of (the one CI runs).
    fn server() -> ServerInfo;
    fn claim(a: &ClaimArgs<'_>) -> Vec<Stmt<Self::D>>;
    fn settle(
        m: &Mapping,
        strategy: Strategy,
        target: &Target<'_>,
        outcome: &Outcome,
    ) -> Result<Vec<Stmt<Self::D>>>;
}

#[cfg(feature = "postgres")]
pub(crate) struct Postgres;
#[cfg(feature = "postgres")]
impl Builders for Postgres {
    type D = crate::backend::postgres::Sql;
    fn server() -> ServerInfo {
        ServerInfo::new(ServerKind::Postgres, "15.20")
    }
    fn claim(a: &ClaimArgs<'_>) -> Vec<Stmt<Self::D>> {
        crate::backend::postgres::claim::statements(a)
    }
    fn settle(
        m: &Mapping,
        strategy: Strategy,
        target: &Target<'_>,
        outcome: &Outcome,
    ) -> Result<Vec<Stmt<Self::D>>> {
        crate::backend::postgres::store::settle_statements(m, strategy, TOKEN, target, outcome)
    }
}

#[cfg(feature = "mysql")]
pub(crate) struct MySql;
#[cfg(feature = "mysql")]
impl Builders for MySql {
    type D = crate::backend::mysql::Sql;
    fn server() -> ServerInfo {
        ServerInfo::new(ServerKind::MariaDb, "10.11.19-MariaDB")
    }
    fn claim(a: &ClaimArgs<'_>) -> Vec<Stmt<Self::D>> {
        crate::backend::mysql::claim::statements(a)
    }
    fn settle(
        m: &Mapping,
        strategy: Strategy,
        target: &Target<'_>,
        outcome: &Outcome,
    ) -> Result<Vec<Stmt<Self::D>>> {
        crate::backend::mysql::store::settle_statements(m, strategy, TOKEN, target, outcome)
    }
}

#[cfg(feature = "sqlite")]
pub(crate) struct Sqlite;
#[cfg(feature = "sqlite")]
impl Builders for Sqlite {
    type D = crate::backend::sqlite::Sql;
    fn server() -> ServerInfo {
        ServerInfo::new(ServerKind::Sqlite, "3.51.3")
    }
    fn claim(a: &ClaimArgs<'_>) -> Vec<Stmt<Self::D>> {
        crate::backend::sqlite::claim::statements(a)
    }
    fn settle(
        m: &Mapping,
        strategy: Strategy,
        target: &Target<'_>,
        outcome: &Outcome,
    ) -> Result<Vec<Stmt<Self::D>>> {
        crate::backend::sqlite::store::settle_statements(m, strategy, TOKEN, target, outcome)
    }
}

/// What one strategy sends on a table of `shape`: a claim, a complete of row 1 and a release of
/// row 2, a release of row 2 by hand; or the error that refuses the strategy.
fn record<B: Builders>(shape: Shape, strategy: Strategy) -> String {
    let m = table::<B::D>(shape);
    let server = B::server();
    if let Err(e) = strategy.resolve(&server, &m) {
        return format!("-- refused: {e}");
    }
    let a = claim_args(&m, strategy);
    let mut text = format!("-- claim\n{}", show(B::claim(&a)));
    let one = |id: i64| IdList::Int(vec![id]);
    for (what, id, outcome) in [
        ("complete", 1, Outcome::Done(None)),
        ("release", 2, Outcome::Ready),
    ] {
        let list = one(id);
        let target = Target::Ids(&list, 1);
        let sent = match strategy {
            // Its rows are settled inside the claim's own transaction.
            Strategy::Transaction => Ok(vec![]),
            _ => B::settle(&m, strategy, &target, &outcome),
        };
        text.push_str(&format!("\n\n-- {what} row {id}\n"));
        text.push_str(&match sent {
            Ok(s) => show(s),
            Err(e) => format!("-- refused: {e}"),
        });
    }
    if strategy != Strategy::Transaction {
        let r = crate::backend::once::release_sql::<B::D>(&m, strategy, &RowId::Int(2), None);
        let statements = r.lock.into_iter().chain(r.lease).chain([r.row]);
        text.push_str(&format!(
            "\n\n-- release row 2 by hand\n{}",
            show(statements)
        ));
    }
    text
}

fn snapshot_dialect<B: Builders>(dialect: &str) {
    for shape in [Shape::StatusOnly, Shape::Full] {
        for strategy in STRATEGIES {
            let text = record::<B>(shape, strategy);
            let name = format!("{dialect}__{shape:?}__{strategy}").to_lowercase();
            insta::assert_snapshot!(name, text);
        }
    }
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_sql() {
    snapshot_dialect::<Postgres>("postgres");
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_sql() {
    snapshot_dialect::<MySql>("mysql");
}

#[cfg(feature = "sqlite")]
#[test]
fn sqlite_sql() {
    snapshot_dialect::<Sqlite>("sqlite");
}
