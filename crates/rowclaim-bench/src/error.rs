//! The bench's one error type, [`BenchError`], and [`Context`], which names what was being done
//! when an error happened ("token with 4 workers: …").
//!
//! Like the library's errors, every message is complete on its own (a wrapped error's text is part
//! of it), so a caller prints `{}` once; the sources stay reachable for callers that sort errors,
//! such as the `rowclaim` command choosing its exit code.

/// Everything that can make a bench run fail.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A flag the user must fix; the message names the flag.
    #[error("{0}")]
    BadInput(String),

    /// The run finished but its own check failed: a row was processed twice, left behind, or a
    /// worker did not complete everything. The figures of such a run mean nothing.
    #[error("bench FAILED its own check: {0}")]
    CheckFailed(String),

    /// Something the bench ran besides the database failed: `rowclaim work`, or the COMMAND of
    /// `bench spawn`.
    #[error("{0}")]
    Failed(String),

    /// The library refused or failed; its kind says why.
    #[error("{0}")]
    Library(#[from] rowclaim::Error),

    /// SQL the bench runs itself (its tables, fills, the plain client) failed.
    #[error("{0}")]
    Database(#[from] sqlx::Error),

    /// A file or a child process could not be written, started or waited for.
    #[error("{0}")]
    Io(#[from] std::io::Error),

    /// A claim loop or worker task panicked.
    #[error("{0}")]
    Panicked(#[from] tokio::task::JoinError),

    /// What the bench was doing when `source` happened.
    #[error("{what}: {source}")]
    Context {
        /// e.g. `"token with 4 workers"`, `"--svg: writing chart.svg"`.
        what: String,
        /// What went wrong.
        source: Box<BenchError>,
    },
}

impl BenchError {
    /// Whether the user can fix this by changing the command line: the bench's own flag checks,
    /// and the library's input errors (a strategy the server cannot do, a missing table). The
    /// `rowclaim-bench` binary exits 2 for these; `rowclaim bench` sorts errors itself.
    pub fn is_bad_input(&self) -> bool {
        match self {
            BenchError::BadInput(_) => true,
            BenchError::Library(e) => matches!(
                e.kind(),
                rowclaim::ErrorKind::BadInput | rowclaim::ErrorKind::MissingTable
            ),
            BenchError::Context { source, .. } => source.is_bad_input(),
            BenchError::CheckFailed(_)
            | BenchError::Failed(_)
            | BenchError::Database(_)
            | BenchError::Io(_)
            | BenchError::Panicked(_) => false,
        }
    }
}

/// `Result` with [`BenchError`].
pub type Result<T, E = BenchError> = std::result::Result<T, E>;

/// Says what was being done when an error happened, on any result whose error becomes a
/// [`BenchError`].
pub(crate) trait Context<T> {
    /// Wraps the error with `what`.
    fn context(self, what: impl Into<String>) -> Result<T>;
    /// Wraps the error with `what()`, which is only called on an error.
    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T>;
}

impl<T, E: Into<BenchError>> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl Into<String>) -> Result<T> {
        self.with_context(|| what)
    }

    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T> {
        self.map_err(|e| BenchError::Context {
            what: what().into(),
            source: Box::new(e.into()),
        })
    }
}

/// Bad input naming the flag.
pub(crate) fn bad(why: impl Into<String>) -> BenchError {
    BenchError::BadInput(why.into())
}

/// The error of a run whose own check failed.
pub(crate) fn check_failed(what: impl std::fmt::Display) -> BenchError {
    BenchError::CheckFailed(what.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_says_what_then_why() {
        let e: Result<()> = Err(bad("--rows must be at least 1"));
        let e = e.context("contention").unwrap_err();
        assert_eq!(e.to_string(), "contention: --rows must be at least 1");
        assert!(e.is_bad_input());
        assert!(!check_failed("2 rows left").is_bad_input());
    }
}
