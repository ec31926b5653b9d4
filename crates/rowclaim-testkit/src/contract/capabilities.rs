//! What each known server must say it can do.
//!
//! The rest of the suite takes a server's word ([`rowclaim::ServerInfo::supports`]) for what
//! applies. That alone would let a driver that wrongly reports, say, no SKIP LOCKED turn every
//! skip-locked case into a check of the refusal, and pass. This case pins the answers for the
//! servers rowclaim supports, from the documentation of [`Capability`], so such a slip fails here.
//!
//! A new backend proves itself by a driver and one `contract_suite!` invocation (see
//! [`crate::contract`]); the match below will not compile until it gets its arm, which is the
//! point: say here what the new server has.

use std::sync::Arc;

use rowclaim::Capability;

use crate::{Backend, TestDb};

/// Asks the server of `t` for every capability and compares with what that kind of server has.
pub async fn as_documented(t: Arc<TestDb>) {
    let server = t.server().await;
    let about = &server.description;
    let (name, version) = name_and_version(about);
    let expected: [(Capability, bool); 5] = match t.backend {
        Backend::Postgres => {
            assert_eq!(name, "PostgreSQL", "{about}");
            [
                // 9.5 and later; nothing older is supported (or still around).
                (Capability::SkipLocked, true),
                (Capability::Listen, true),
                (Capability::Returning, true),
                (Capability::ConcurrentWriters, true),
                (Capability::RowLocksSeenByAllWriters, true),
            ]
        }
        Backend::MySql => {
            let skip_locked = match name {
                "MariaDB" => version >= (10, 6, 0),
                "MySQL" => version >= (8, 0, 1),
                other => panic!("a MariaDB or MySQL server, not {other:?}: {about}"),
            };
            [
                (Capability::SkipLocked, skip_locked),
                (Capability::Listen, false),
                // MariaDB has RETURNING on INSERT and DELETE only, not on the UPDATE a claim is.
                (Capability::Returning, false),
                (Capability::ConcurrentWriters, true),
                // Not on a Galera cluster, whose nodes each keep their own locks.
                (
                    Capability::RowLocksSeenByAllWriters,
                    !about.ends_with("(Galera cluster)"),
                ),
            ]
        }
        Backend::Sqlite => {
            assert_eq!(name, "SQLite", "{about}");
            [
                (Capability::SkipLocked, false),
                (Capability::Listen, false),
                (Capability::Returning, true),
                (Capability::ConcurrentWriters, false),
                // One writer at a time: the whole database is locked.
                (Capability::RowLocksSeenByAllWriters, true),
            ]
        }
    };
    for (capability, has) in expected {
        assert_eq!(
            server.supports(capability),
            has,
            "{about}: supports({capability:?})"
        );
    }
}

/// `("MariaDB", (10, 11, 6))` from `MariaDB 10.11.6` (or `MariaDB 10.11.6 (Galera cluster)`),
/// the form of `ServerInfo::description`.
fn name_and_version(description: &str) -> (&str, (u32, u32, u32)) {
    let (name, rest) = description
        .split_once(' ')
        .unwrap_or_else(|| panic!("a server description is `NAME VERSION`: {description:?}"));
    let version = rest.split(' ').next().unwrap_or_default();
    let mut parts = version.split('.').map(|p| {
        p.parse::<u32>()
            .unwrap_or_else(|e| panic!("version {version:?} of {description:?}: {e}"))
    });
    let mut next = || parts.next().unwrap_or(0);
    (name, (next(), next(), next()))
}
