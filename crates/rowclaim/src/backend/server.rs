//! The server behind a connection: what it is and what it can do.

/// The server behind a connection and what it can do.
#[derive(Clone, Debug)]
pub struct ServerInfo {
    /// `PostgreSQL 15.4`, `MariaDB 10.11.6`, `MySQL 8.0.36`, `SQLite 3.46.0`,
    /// `MariaDB 10.11.6 (Galera cluster)`.
    pub description: String,
    pub(crate) kind: ServerKind,
    pub(crate) version: (u32, u32, u32),
    /// A node of a multi-writer cluster (MariaDB Galera, `wsrep_on`): its row locks are its own,
    /// and conflicts between nodes surface when a transaction commits.
    pub(crate) cluster_node: bool,
}

/// Something a server can do that not every server can (see [`ServerInfo::supports`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Capability {
    /// `FOR UPDATE SKIP LOCKED` (PostgreSQL 9.5+, MySQL 8.0.1+, MariaDB 10.6+): the
    /// `skip-locked` strategy and `LockWait::SkipLocked`.
    SkipLocked,
    /// Wake-ups pushed by the server (PostgreSQL `LISTEN`/`NOTIFY`): idle workers need not poll.
    Listen,
    /// `UPDATE … RETURNING`: a statement says which rows it changed, so a batch of results is
    /// fenced row by row in one statement.
    Returning,
    /// Writers that do not wait for each other (row locks, not one lock for the whole database
    /// as SQLite has).
    ConcurrentWriters,
    /// A row lock holds off every writer of the database. Not so on a MariaDB Galera cluster: a
    /// lock is seen only by the node that took it, writers on other nodes go ahead, and the
    /// conflict surfaces when one of the transactions commits (the other is rolled back). There
    /// a claim is trusted only once its commit is known to have taken effect, and the
    /// `transaction` strategy (which relies on locks held while a job runs) is refused.
    RowLocksSeenByAllWriters,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ServerKind {
    Postgres,
    MySql,
    MariaDb,
    Sqlite,
}

impl ServerInfo {
    pub(crate) fn new(kind: ServerKind, version_text: &str) -> ServerInfo {
        // "15.4 (Debian 15.4-1)", "10.11.6-MariaDB-0+deb12u1", "8.0.36": the first word counts.
        let first = version_text.split_whitespace().next().unwrap_or_default();
        let mut nums = first
            .split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().unwrap_or(0));
        let version = (
            nums.next().unwrap_or(0),
            nums.next().unwrap_or(0),
            nums.next().unwrap_or(0),
        );
        let name = match kind {
            ServerKind::Postgres => "PostgreSQL",
            ServerKind::MySql => "MySQL",
            ServerKind::MariaDb => "MariaDB",
            ServerKind::Sqlite => "SQLite",
        };
        let v = version;
        ServerInfo {
            description: format!("{name} {}.{}.{}", v.0, v.1, v.2),
            kind,
            version,
            cluster_node: false,
        }
    }

    /// This server as a node of a Galera cluster (MariaDB with `wsrep_on`).
    pub(crate) fn galera_node(mut self) -> ServerInfo {
        self.cluster_node = true;
        self.description.push_str(" (Galera cluster)");
        self
    }

    /// Whether the server can do `what`. Ask this instead of matching on the database: a new
    /// backend (or a new version of one) then works by saying what it has.
    pub fn supports(&self, what: Capability) -> bool {
        match what {
            Capability::SkipLocked => self.skip_locked().is_ok(),
            Capability::Listen => self.kind == ServerKind::Postgres,
            // MariaDB has RETURNING on INSERT and DELETE only; MySQL not at all.
            Capability::Returning => matches!(self.kind, ServerKind::Postgres | ServerKind::Sqlite),
            Capability::ConcurrentWriters => self.kind != ServerKind::Sqlite,
            Capability::RowLocksSeenByAllWriters => !self.cluster_node,
        }
    }

    /// Whether `SKIP LOCKED` exists here; the error says which version would have it.
    pub(crate) fn skip_locked(&self) -> std::result::Result<(), String> {
        let need = match self.kind {
            ServerKind::Postgres => (9, 5, 0),
            ServerKind::MySql => (8, 0, 1),
            ServerKind::MariaDb => (10, 6, 0),
            ServerKind::Sqlite => {
                return Err("SQLite has no SKIP LOCKED (it has one writer at a time)".into())
            }
        };
        if self.version >= need {
            Ok(())
        } else {
            Err(format!(
                "SKIP LOCKED needs {} {}.{}.{} or later, and the server is {}",
                self.description.split(' ').next().unwrap_or_default(),
                need.0,
                need.1,
                need.2,
                self.description
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_skip_locked() {
        let pg = ServerInfo::new(ServerKind::Postgres, "15.20 (Debian 15.20-0+deb12u1)");
        assert_eq!(pg.description, "PostgreSQL 15.20.0");
        assert!(pg.skip_locked().is_ok());
        let old = ServerInfo::new(ServerKind::MariaDb, "10.5.23-MariaDB-0+deb11u1");
        let why = old.skip_locked().unwrap_err();
        assert!(why.contains("MariaDB 10.6.0 or later"), "{why}");
        assert!(why.contains("10.5.23"), "{why}");
        assert!(ServerInfo::new(ServerKind::MariaDb, "10.11.6-MariaDB")
            .skip_locked()
            .is_ok());
        assert!(ServerInfo::new(ServerKind::MySql, "8.0.0")
            .skip_locked()
            .is_err());
        assert!(ServerInfo::new(ServerKind::MySql, "8.0.36")
            .skip_locked()
            .is_ok());
        assert!(ServerInfo::new(ServerKind::Sqlite, "3.51.3")
            .skip_locked()
            .is_err());
        assert!(!old.supports(Capability::SkipLocked));
        assert!(pg.supports(Capability::Listen) && pg.supports(Capability::Returning));
        let maria = ServerInfo::new(ServerKind::MariaDb, "10.11.6-MariaDB");
        assert!(!maria.supports(Capability::Listen) && !maria.supports(Capability::Returning));
        assert!(maria.supports(Capability::SkipLocked));
        assert!(maria.supports(Capability::RowLocksSeenByAllWriters));
        let galera = maria.galera_node();
        assert_eq!(galera.description, "MariaDB 10.11.6 (Galera cluster)");
        assert!(!galera.supports(Capability::RowLocksSeenByAllWriters));
        assert!(galera.supports(Capability::SkipLocked));
    }
}
