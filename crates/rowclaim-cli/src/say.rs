//! Informational lines on stderr (`rowclaim: strategy auto chose …`), which `--quiet` silences.
//! Results (stdout) and errors (printed once by `main`) are not informational: they always show.

use std::sync::atomic::{AtomicBool, Ordering};

static QUIET: AtomicBool = AtomicBool::new(false);

/// Set once by `main` from `--quiet`, before any command runs.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// Whether `--quiet` was given (progress bars ask too).
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// `rowclaim: …` on stderr, unless `--quiet`.
pub fn info(line: std::fmt::Arguments<'_>) {
    if !quiet() {
        eprintln!("rowclaim: {line}");
    }
}

/// [`info`] with `format!` arguments: `say!("enqueued {n} jobs")`.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::say::info(format_args!($($arg)*))
    };
}
pub(crate) use say;
