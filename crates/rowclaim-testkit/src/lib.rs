//! What rowclaim's tests share, and what a new backend must pass.
//!
//! - [`TestDb`] and [`with_db`] ([`testdb`]): a fresh database (PostgreSQL, MariaDB/MySQL) or file
//!   (SQLite) per test, dropped afterwards even when the test panics. Every test of the library
//!   and of the CLI gets its database this way, so tests never see each other's rows.
//! - [`servers`]: private PostgreSQL/MariaDB servers on spare ports, for fault tests that stop,
//!   crash and restart a server or kill its sessions without touching the machine's shared ones.
//! - [`pgbouncer`]: a PgBouncer in transaction pooling mode in front of a server; a test's
//!   database reached through one is [`Via::PgBouncer`].
//! - [`galera`]: a 3-node MariaDB Galera cluster on spare ports, for the Galera test.
//! - [`documented_sql`]: the enqueue SQL of `docs/enqueue-sql.md`, as tests run it.
//! - [`browser`]: a headless Chromium under a private chromedriver, driven over WebDriver, for
//!   tests of web pages.
//! - [`proxy`]: a TCP proxy between clients and such a server, to cut or black-hole connections.
//! - [`contract`] and [`contract_suite!`]: the contract every backend × strategy must pass
//!   (exclusive claims, expired leases re-claimed and fenced, release, order, locking reads, bad
//!   input refused). What applies is decided by asking the server what it can do
//!   ([`rowclaim::ServerInfo::supports`]), not by matching on the backend's name.
//!
//! **How a new backend proves itself:** implement the driver in the library, add its variant to
//! [`Backend`] (and how [`TestDb`] makes a database on it), then add one
//! `rowclaim_testkit::contract_suite!(Backend::Yours)` to `crates/rowclaim/tests/contract.rs`.
//! Every case then runs on it as its own test; where the server says it lacks something a
//! strategy needs, the case checks that the strategy is refused instead.
//!
//! The servers come from `ROWCLAIM_TEST_POSTGRES` and `ROWCLAIM_TEST_MYSQL` (admin URLs;
//! `scripts/test` sets them and starts the servers when they are missing).
//!
//! This crate is not published: it panics on every failure (it is test code) and its API changes
//! whenever the tests need it to.

pub mod browser;
pub mod contract;
pub mod galera;
pub mod pgbouncer;
pub mod proxy;
pub mod servers;
pub mod testdb;
pub mod tls;

pub use testdb::{with_db, with_db_via, Backend, TestDb, Via};

/// What [`contract_suite!`]'s expansion names through `$crate`, so that the test file invoking it
/// needs no dependency of its own on tokio or rowclaim. Not for anything else.
#[doc(hidden)]
pub mod __private {
    pub use rowclaim;
    pub use tokio;
}

/// The SQL block of `docs/enqueue-sql.md` marked `<!-- tested: NAME -->`: tests run the
/// documented enqueue as it is written there.
pub fn documented_sql(name: &str) -> String {
    let doc = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/enqueue-sql.md"
    ));
    let marker = format!("<!-- tested: {name} -->\n```sql\n");
    let start = doc
        .find(&marker)
        .unwrap_or_else(|| panic!("docs/enqueue-sql.md has no block {name:?}"))
        + marker.len();
    let len = doc[start..]
        .find("```")
        .unwrap_or_else(|| panic!("docs/enqueue-sql.md: block {name:?} does not end"));
    doc[start..start + len].to_owned()
}
