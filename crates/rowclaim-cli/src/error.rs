//! The command's one error type, [`CliError`]: every way a command ends other than success, each
//! with the exit code it means (see `exit.rs` for the codes) and the one line printed for it.

use rowclaim::ErrorKind;
use rowclaim_bench::BenchError;

use crate::exit::{self, Exit};

/// How a command ends when it does not succeed. `main` prints [`CliError::explain`] once, as
/// `rowclaim: …`, and exits with [`CliError::exit_code`].
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Input the user must fix: a flag, a config file, a malformed JSON payload.
    #[error("{0}")]
    BadInput(String),

    /// Nothing to do, which a script may want to know: `claim` found nothing claimable, `jobs`
    /// found no such job or changed none. The text says which, e.g. `no job 7`.
    #[error("{0}")]
    NothingClaimed(String),

    /// The library refused or failed; its [`ErrorKind`] chooses the exit code.
    #[error("{0}")]
    Library(#[from] rowclaim::Error),

    /// A library error said with where rowclaim looked or what to do: a table missing from the
    /// database (named), a SQLite file missing, or a SQLite file this user may not write.
    #[error("{source} {context}")]
    Located {
        source: Box<rowclaim::Error>,
        /// E.g. `in sqlite://rowclaim.db`.
        context: String,
    },

    /// `rowclaim bench` failed (bad flags, a failed self-check, the database).
    #[error("{0}")]
    Bench(#[from] BenchError),

    /// `work --until-empty` ran out of rows, but not every row ended done. The text is the
    /// worker's summary.
    #[error("{0}")]
    Incomplete(String),

    /// `work` was stopped by a second signal. The text is the worker's summary.
    #[error("{0}")]
    Interrupted(String),

    /// `check` found something that makes claims slow or unsafe; the report is on stdout. The
    /// text counts the findings and names their topics.
    #[error("{summary}")]
    CheckFound { exit: Exit, summary: String },

    /// `demo`'s workers did not share the rows exactly once.
    #[error("demo FAILED its own check: {0}")]
    DemoFailed(String),

    /// Reading input, writing output, listening for signals, making a temporary directory.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, e.g. `"reading stdin"`.
        what: &'static str,
        source: std::io::Error,
    },

    /// The metrics recorder could not be set up (`--metrics`, the dashboard's `/metrics`).
    #[error("setting up metrics: {0}")]
    Metrics(String),

    /// A task the command started panicked (a bug).
    #[error("{what}: {source}")]
    Panicked {
        what: &'static str,
        source: tokio::task::JoinError,
    },
}

impl CliError {
    /// An [`CliError::Io`] for `map_err`: `.map_err(CliError::io("reading stdin"))`.
    pub fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> CliError {
        move |source| CliError::Io { what, source }
    }

    /// The exit code this error means. Every variant is named, so a new one must be given a code.
    pub fn exit_code(&self) -> Exit {
        match self {
            CliError::BadInput(_) => exit::BAD_INPUT,
            CliError::NothingClaimed(_) => exit::NOTHING_CLAIMED,
            CliError::Library(e) => library_exit(e),
            CliError::Located { source, .. } => library_exit(source),
            CliError::Bench(e) => bench_exit(e),
            CliError::Incomplete(_) => exit::INCOMPLETE,
            CliError::Interrupted(_) => exit::INTERRUPTED,
            CliError::CheckFound { exit, .. } => *exit,
            CliError::DemoFailed(_)
            | CliError::Io { .. }
            | CliError::Metrics(_)
            | CliError::Panicked { .. } => exit::FAILURE,
        }
    }

    /// The error and its causes in one line, each said once. A library error's message is
    /// complete (it carries its cause's text), so the chain ends there. An enqueue whose outcome
    /// is unknown gets the hint how to find out.
    pub fn explain(&self) -> String {
        let mut said: Vec<String> = Vec::new();
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(self);
        let mut library = None;
        while let Some(c) = cause {
            let text = c.to_string();
            if !said.iter().any(|s| s.contains(&text)) {
                said.push(text);
            }
            // The library's error, also boxed ([`CliError::Located`]): its own text says its
            // causes already.
            let boxed = c.downcast_ref::<Box<rowclaim::Error>>().map(|b| &**b);
            if let Some(e) = c.downcast_ref::<rowclaim::Error>().or(boxed) {
                library = Some(e);
                break;
            }
            cause = c.source();
        }
        let mut line = said.join(": ");
        if let Some(rowclaim::Error::OutcomeUnknown { what, .. }) = library {
            if what.starts_with("the enqueue") {
                line.push_str("; check with `rowclaim jobs list` before enqueueing again");
            }
        }
        line
    }
}

/// A library error's exit code, by its kind (the library's drivers sort database errors).
fn library_exit(e: &rowclaim::Error) -> Exit {
    match e.kind() {
        // A missing table is for the user to fix: a typo in --table, or `rowclaim init` not run.
        ErrorKind::BadInput
        | ErrorKind::MissingTable
        | ErrorKind::NotInitialised
        | ErrorKind::PermissionDenied => exit::BAD_INPUT,
        ErrorKind::LeaseLost => exit::LEASE_LOST,
        ErrorKind::OutcomeUnknown => exit::OUTCOME_UNKNOWN,
        ErrorKind::LockConflict
        | ErrorKind::Transient
        | ErrorKind::ConnectionGone
        | ErrorKind::Stopped
        | ErrorKind::Internal
        | ErrorKind::Other => exit::FAILURE,
        // No `_` arm: ErrorKind is exhaustive, so a kind added to the library does not compile
        // here until it has an exit code.
    }
}

/// A bench error's exit code: bad flags are bad input, the library's errors go by their kind,
/// the rest (a failed self-check, the bench's own SQL) is a failure.
fn bench_exit(e: &BenchError) -> Exit {
    match e {
        BenchError::BadInput(_) => exit::BAD_INPUT,
        BenchError::Library(e) => library_exit(e),
        BenchError::Context { source, .. } => bench_exit(source),
        BenchError::CheckFailed(_)
        | BenchError::Failed(_)
        | BenchError::Database(_)
        | BenchError::Io(_)
        | BenchError::Panicked(_) => exit::FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_errors_exit_by_kind() {
        let lost = rowclaim::Error::LeaseLost {
            token: "t".into(),
            ids: vec![],
        };
        assert_eq!(CliError::from(lost).exit_code(), exit::LEASE_LOST);
        let missing = rowclaim::Error::MissingTable { table: "x".into() };
        assert_eq!(CliError::from(missing).exit_code(), exit::BAD_INPUT);
        let gave_up = rowclaim::Error::GaveUp {
            lasted: std::time::Duration::from_secs(5),
            last: "refused".into(),
        };
        assert_eq!(CliError::from(gave_up).exit_code(), exit::FAILURE);
        let queue = rowclaim::Error::NotInitialised {
            what: "the managed queue",
            older: false,
            source: None,
        };
        assert_eq!(CliError::from(queue).exit_code(), exit::BAD_INPUT);
    }

    #[test]
    fn bench_errors_exit_by_what_is_inside() {
        let unsupported = rowclaim::Error::Unsupported("no".into());
        let wrapped = BenchError::Context {
            what: "--strategies: skip-locked".into(),
            source: Box::new(BenchError::Library(unsupported)),
        };
        assert_eq!(CliError::from(wrapped).exit_code(), exit::BAD_INPUT);
        let check = BenchError::CheckFailed("2 rows left".into());
        assert_eq!(CliError::from(check).exit_code(), exit::FAILURE);
    }

    #[test]
    fn each_cause_is_said_once() {
        let e = CliError::from(rowclaim::Error::InvalidInput("a zero lease".into()));
        assert_eq!(e.explain(), "a zero lease");
        let e = CliError::Io {
            what: "reading stdin",
            source: std::io::Error::other("broken pipe"),
        };
        assert_eq!(e.explain(), "reading stdin: broken pipe");
        let e = CliError::from(BenchError::Context {
            what: "token with 2 workers".into(),
            source: Box::new(BenchError::Library(rowclaim::Error::InvalidInput(
                "batch 0".into(),
            ))),
        });
        assert_eq!(e.explain(), "token with 2 workers: batch 0");
    }
}
