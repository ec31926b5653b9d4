//! The contract every backend × strategy must pass, run on each backend this build has.
//!
//! The cases live in `rowclaim_testkit::contract`; `contract_suite!` makes each one a test of its
//! own here (`postgres::skip_locked::drain_8_claimers`, …). What applies to a backend is decided
//! by asking its server what it can do; where it lacks what a strategy needs, the strategy's
//! refusal is what gets tested.
//!
//! A new backend proves itself here: implement the driver, then add one `contract_suite!`
//! invocation below, behind the backend's feature.

#[cfg(feature = "postgres")]
mod postgres {
    rowclaim_testkit::contract_suite!(rowclaim_testkit::Backend::Postgres);
}

/// PostgreSQL through PgBouncer in transaction pooling mode: every claim, settle, locking read
/// and counter passes a pooler whose few server connections the test's clients share.
#[cfg(feature = "postgres")]
mod postgres_pgbouncer {
    rowclaim_testkit::contract_suite!(
        rowclaim_testkit::Backend::Postgres,
        rowclaim_testkit::Via::PgBouncer
    );
}

#[cfg(feature = "mysql")]
mod mysql {
    rowclaim_testkit::contract_suite!(rowclaim_testkit::Backend::MySql);
}

#[cfg(feature = "sqlite")]
mod sqlite {
    rowclaim_testkit::contract_suite!(rowclaim_testkit::Backend::Sqlite);
}
