//! The contract every backend × strategy must pass, as functions of a backend, and
//! [`contract_suite!`](crate::contract_suite) to run all of them on one backend.
//!
//! (a) concurrent claimers drain a table, each row done exactly once; (b) an expired lease is
//! re-claimed and the late claimer's complete is fenced off; (c) release gives rows back; (d) the
//! ORDER BY is honoured; (e) locking reads: NOWAIT → `Locked`, SKIP LOCKED skips; (f) bad input
//! is refused with an error naming the problem and the table is left untouched. Then the edges
//! that reviews found: extending leases, all-or-nothing settles, status-only tables, `auto`, the
//! counter, stats.
//!
//! **How a new backend proves itself:** implement the driver, then add one
//! `rowclaim_testkit::contract_suite!(Backend::Yours)` (in its own module, behind its feature) to
//! `crates/rowclaim/tests/contract.rs`. Its new [`crate::Backend`] variant leaves
//! [`capabilities::as_documented`] uncompiled until it states what the new server can do: that
//! pin is what keeps the rest of the suite honest.
//!
//! - [`strategy`]: cases run once per strategy. Every strategy is generated for every backend;
//!   [`for_strategy`] asks the server whether it has what the strategy needs and, where it does
//!   not, checks that the strategy is refused ([`rowclaim::Error::UnsupportedStrategy`]) instead
//!   of running the case. So a gap shows up as a checked refusal, never as a silent pass.
//! - [`backend`]: cases run once per backend (locking reads, bad input, `auto`, …).
//! - [`capabilities`]: what each known server must say it can do.
//!
//! What a case expects depends on the server's capabilities, asked at run time
//! ([`rowclaim::ServerInfo::supports`] through [`rowclaim::Db::server`] or
//! [`rowclaim::Claimer::server`]), not on which backend it is: a new backend then gets the right
//! expectations by saying what it has. [`crate::Backend`] is matched only for SQL dialect in the
//! test's own raw SQL (concatenation, a schema-qualified table name) and for messages that are
//! the driver's own wording.

pub mod backend;
pub mod capabilities;
pub mod strategy;

use std::future::Future;
use std::sync::Arc;

use rowclaim::{Capability, Error, Source, Strategy};

use crate::TestDb;

/// The `jobs` table of [`TestDb::jobs`] with every optional column mapped: every strategy can
/// run on it, so where one is refused, the server is the reason.
pub fn full_source() -> Source {
    Source::new("jobs")
        .owner_column("owner")
        .lease_column("lease_until")
        .attempts_column("attempts")
}

/// What `strategy` needs of a server beyond what every supported server has. Kept next to the
/// suite rather than asked of the library: the suite checks the library's refusals against it.
pub fn needs(strategy: Strategy) -> &'static [Capability] {
    match strategy {
        Strategy::SkipLocked => &[Capability::SkipLocked],
        // Its locks are held while the job runs: they must hold off every other claimer.
        Strategy::Transaction => &[Capability::RowLocksSeenByAllWriters],
        Strategy::Auto | Strategy::Token | Strategy::Optimistic | Strategy::LeaseTable => &[],
        // `Strategy` is non_exhaustive. A new one must be listed here (and given its module in
        // `contract_suite!`) before the suite can say what applies to it.
        other => panic!("the contract suite does not know what {other} needs: add it to `needs`"),
    }
}

/// How the library's refusals name a capability that [`needs`] lists (in the reason of
/// `UnsupportedStrategy`). A capability gets its wording here when a strategy starts to need it.
fn named(c: Capability) -> &'static str {
    match c {
        Capability::SkipLocked => "SKIP LOCKED",
        Capability::RowLocksSeenByAllWriters => "a row lock is seen only by the node",
        other => unreachable!("no strategy needs {other:?}"),
    }
}

/// Runs the strategy case `case` on `t` when the server has everything `strategy` needs.
/// Otherwise the case does not apply, and what is checked instead is the documented refusal:
/// making a claimer with `strategy` fails with `UnsupportedStrategy` naming that strategy and
/// the missing capability, and writes nothing.
pub async fn for_strategy<F, Fut>(t: Arc<TestDb>, strategy: Strategy, case: F)
where
    F: FnOnce(Arc<TestDb>, Strategy) -> Fut,
    Fut: Future<Output = ()>,
{
    let server = t.server().await;
    let missing: Vec<Capability> = needs(strategy)
        .iter()
        .copied()
        .filter(|c| !server.supports(*c))
        .collect();
    if missing.is_empty() {
        return case(t, strategy).await;
    }

    t.jobs(3).await;
    let db = t.db().await;
    let err = match db.claimer(full_source(), strategy).await {
        Ok(_) => panic!(
            "{} says it lacks {missing:?}, which {strategy} needs, yet a {strategy} claimer was made",
            server.description
        ),
        Err(e) => e,
    };
    match &err {
        Error::UnsupportedStrategy {
            strategy: refused,
            reason,
        } => {
            assert_eq!(*refused, strategy, "the refusal names the strategy: {err}");
            for c in &missing {
                assert!(
                    reason.contains(named(*c)),
                    "the refusal says what is missing ({}): {err}",
                    named(*c)
                );
            }
        }
        other => panic!("expected UnsupportedStrategy for {strategy}, got {other}"),
    }
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status <> 'ready' OR owner IS NOT NULL")
            .await,
        0,
        "a refused strategy wrote nothing"
    );
}

/// Every case of the contract as its own `#[tokio::test]`, on the backend given (an expression
/// of type [`Backend`](crate::Backend); optionally a [`Via`](crate::Via) after it, for the
/// library to reach the database through a pooler), in modules named as the failures will show them:
/// `backend::…` for the cases run once per backend, then one module per strategy
/// (`skip_locked::…`, `token::…`, `optimistic::…`, `lease_table::…`, `transaction::…`).
///
/// Invoke it once per module (it defines `BACKEND` and those modules where it stands), with the
/// backend's feature on the module:
///
/// ```ignore
/// #[cfg(feature = "postgres")]
/// mod postgres {
///     rowclaim_testkit::contract_suite!(rowclaim_testkit::Backend::Postgres);
/// }
/// ```
///
/// Each test makes its own database (see [`with_db`](crate::with_db)) and drops it afterwards.
/// The calling crate needs no dependency of its own on tokio.
#[macro_export]
macro_rules! contract_suite {
    ($backend:expr) => {
        $crate::contract_suite!($backend, $crate::Via::Direct);
    };
    ($backend:expr, $via:expr) => {
        /// The backend this module's suite runs on.
        const BACKEND: $crate::Backend = $backend;
        /// How the library reaches it.
        const VIA: $crate::Via = $via;

        mod backend {
            $crate::__contract_backend_cases!();
        }
        mod skip_locked {
            $crate::__contract_strategy_cases!($crate::__private::rowclaim::Strategy::SkipLocked);
            $crate::__contract_token_cases!($crate::__private::rowclaim::Strategy::SkipLocked);
            $crate::__contract_strategy_case!(
                expired_rows_held_elsewhere_are_passed,
                2,
                held_expired_rows,
                $crate::__private::rowclaim::Strategy::SkipLocked
            );
        }
        mod token {
            $crate::__contract_strategy_cases!($crate::__private::rowclaim::Strategy::Token);
            $crate::__contract_token_cases!($crate::__private::rowclaim::Strategy::Token);
        }
        mod optimistic {
            $crate::__contract_strategy_cases!($crate::__private::rowclaim::Strategy::Optimistic);
            $crate::__contract_token_cases!($crate::__private::rowclaim::Strategy::Optimistic);
        }
        mod lease_table {
            $crate::__contract_strategy_cases!($crate::__private::rowclaim::Strategy::LeaseTable);
            $crate::__contract_token_cases!($crate::__private::rowclaim::Strategy::LeaseTable);
        }
        // The transaction strategy keeps its rows in the claiming process's open transaction:
        // nothing settles them by token (the library refuses, `Error::Unsupported`), so the
        // token cases are not generated for it. That is the strategy's nature, the same on
        // every backend, not a capability a server may lack.
        mod transaction {
            $crate::__contract_strategy_cases!($crate::__private::rowclaim::Strategy::Transaction);
        }
    };
}

/// One test of the suite. `#[tokio::test]` is reached through the kit's re-export; its `crate`
/// argument must be a string, where `$crate` is not expanded, so the kit's name is spelled out
/// (a crate that renames this dependency needs `extern crate <new name> as rowclaim_testkit;`).
///
/// Not formatted by rustfmt: it indents the attribute's arguments further on every run.
#[doc(hidden)]
#[macro_export]
#[rustfmt::skip]
macro_rules! __contract_test {
    ($name:ident, $threads:literal, $body:expr) => {
        #[$crate::__private::tokio::test(
            crate = "::rowclaim_testkit::__private::tokio",
            flavor = "multi_thread",
            worker_threads = $threads
        )]
        async fn $name() {
            $body.await
        }
    };
}

/// The cases run once per strategy (see [`strategy`](crate::contract::strategy)), each through
/// [`for_strategy`](crate::contract::for_strategy).
#[doc(hidden)]
#[macro_export]
macro_rules! __contract_strategy_cases {
    ($strategy:expr) => {
        $crate::__contract_strategy_case!(drain_8_claimers, 4, drain, $strategy);
        $crate::__contract_strategy_case!(
            expired_lease_is_reclaimed_and_fenced,
            2,
            expired_lease,
            $strategy
        );
        $crate::__contract_strategy_case!(release_gives_rows_back, 2, release, $strategy);
        $crate::__contract_strategy_case!(order_by_is_honoured, 2, order, $strategy);
        $crate::__contract_strategy_case!(rows_come_as_json, 2, row_data, $strategy);
        $crate::__contract_strategy_case!(extend_keeps_rows_past_the_lease, 2, extend, $strategy);
    };
}

/// The cases run once per strategy whose claims are settled by token.
#[doc(hidden)]
#[macro_export]
macro_rules! __contract_token_cases {
    ($strategy:expr) => {
        $crate::__contract_strategy_case!(
            empty_claim_means_nothing_claimable,
            2,
            own_rows_back_after_expiry,
            $strategy
        );
        $crate::__contract_strategy_case!(
            complete_of_partly_held_rows_changes_nothing,
            2,
            all_or_nothing,
            $strategy
        );
    };
}

/// The test `$name` running `contract::strategy::$case` with `$strategy` on the suite's backend.
#[doc(hidden)]
#[macro_export]
macro_rules! __contract_strategy_case {
    ($name:ident, $threads:literal, $case:ident, $strategy:expr) => {
        $crate::__contract_test!(
            $name,
            $threads,
            $crate::with_db_via(super::BACKEND, super::VIA, |t| {
                $crate::contract::for_strategy(t, $strategy, $crate::contract::strategy::$case)
            })
        );
    };
}

/// The cases run once per backend (see [`backend`](crate::contract::backend)).
#[doc(hidden)]
#[macro_export]
macro_rules! __contract_backend_cases {
    () => {
        $crate::__contract_backend_case!(
            capabilities_are_as_documented,
            $crate::contract::capabilities::as_documented
        );
        $crate::__contract_backend_case!(
            locking_reads_nowait_and_skip_locked,
            $crate::contract::backend::locking_reads
        );
        $crate::__contract_backend_case!(
            bad_input_is_refused_and_changes_nothing,
            $crate::contract::backend::bad_input
        );
        $crate::__contract_backend_case!(
            lease_table_keys_settles_and_repeated_ids,
            $crate::contract::backend::lease_table_edges
        );
        $crate::__contract_backend_case!(
            auto_picks_a_strategy,
            $crate::contract::backend::auto_choice
        );
        $crate::__contract_backend_case!(counter_is_atomic, $crate::contract::backend::counter);
        $crate::__contract_backend_case!(
            one_mapping_per_table,
            $crate::contract::backend::one_mapping_per_table
        );
        $crate::__contract_backend_case!(
            where_cannot_widen_a_claim,
            $crate::contract::backend::filter_stays_inside
        );
        $crate::__contract_backend_case!(status_only_table_optimistic, |t| {
            $crate::contract::backend::status_only(
                t,
                $crate::__private::rowclaim::Strategy::Optimistic,
            )
        });
        $crate::__contract_backend_case!(status_only_table_lease_table, |t| {
            $crate::contract::backend::status_only(
                t,
                $crate::__private::rowclaim::Strategy::LeaseTable,
            )
        });
        $crate::__contract_backend_case!(status_only_table_transaction, |t| {
            // Refused where row locks do not hold off every writer (a Galera cluster).
            $crate::contract::for_strategy(
                t,
                $crate::__private::rowclaim::Strategy::Transaction,
                $crate::contract::backend::status_only,
            )
        });
        $crate::__contract_backend_case!(stats_token, |t| {
            $crate::contract::backend::stats(t, $crate::__private::rowclaim::Strategy::Token)
        });
        $crate::__contract_backend_case!(stats_lease_table, |t| {
            $crate::contract::backend::stats(t, $crate::__private::rowclaim::Strategy::LeaseTable)
        });
    };
}

/// The test `$name` running `$case` (a function of the test's database) on the suite's backend.
#[doc(hidden)]
#[macro_export]
macro_rules! __contract_backend_case {
    ($name:ident, $case:expr) => {
        $crate::__contract_test!(
            $name,
            2,
            $crate::with_db_via(super::BACKEND, super::VIA, $case)
        );
    };
}
