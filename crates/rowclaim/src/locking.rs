//! How a locking read (seed 001) locks rows, and what it does about rows locked already.

/// How a locking read locks rows (seed 001).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockMode {
    /// `FOR SHARE` (`LOCK IN SHARE MODE` on MariaDB): others may read, not change.
    Share,
    /// `FOR UPDATE`: as if the rows were being updated.
    Update,
}

/// What a locking read does about rows another transaction has locked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockWait {
    /// Wait for them.
    Wait,
    /// Fail at once with [`Error::Locked`](crate::Error::Locked).
    NoWait,
    /// Leave them out of the result.
    SkipLocked,
}
