//! Logging on stderr for `rowclaim-bench` (and the filter `rowclaim` uses for its own log).

/// The log target of what an operator did through `rowclaim dashboard` (logins, actions, refused
/// requests): logged at every verbosity, `--quiet` included, because it is the audit trail.
pub const AUDIT: &str = "rowclaim::audit";

/// Logging on stderr for `rowclaim-bench` (`rowclaim` has its own voice, over [`log_filter`]):
/// `-v` says what rowclaim decides, `-vv` every retry; `ROWCLAIM_LOG` (an `EnvFilter`) overrides
/// both.
pub fn init_logging(verbose: u8) {
    init_logging_with(verbose, false, None);
}

/// Logging for `--quiet`: errors only (`ROWCLAIM_LOG` still overrides).
pub fn init_quiet_logging() {
    init_logging_with(0, true, None);
}

/// A subscriber layer installed beside the stderr log, with its own filter: the `rowclaim`
/// command's OpenTelemetry export.
pub type ExtraLayer =
    Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync + 'static>;

/// [`init_logging`] (or, `quiet`, [`init_quiet_logging`]) with `extra` beside the stderr log.
pub fn init_logging_with(verbose: u8, quiet: bool, extra: Option<ExtraLayer>) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    // One layer per arm below: each is typed for the subscriber under it.
    macro_rules! stderr {
        () => {
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                // Where a line comes from in the code helps when debugging (-v), not otherwise.
                .with_target(verbose > 0 && !quiet)
                .with_filter(log_filter(verbose, quiet))
        };
    }
    // Without an extra layer the registry gets none, not a `None` one: an absent layer of
    // `Option` type takes an interest in every span, so that each job's span would be made
    // (and dropped unseen) on every run.
    match extra {
        Some(extra) => tracing_subscriber::registry()
            .with(extra)
            .with(stderr!())
            .init(),
        None => tracing_subscriber::registry().with(stderr!()).init(),
    }
}

/// What the stderr log shows at a verbosity: `--quiet` errors only, by default warnings, `-v`
/// what rowclaim decides, `-vv` every retry and the driver's own warnings; `ROWCLAIM_LOG` (an
/// `EnvFilter`) overrides them. [`AUDIT`] is at info in every case but `ROWCLAIM_LOG`'s.
pub fn log_filter(verbose: u8, quiet: bool) -> tracing_subscriber::EnvFilter {
    let level = match (quiet, verbose) {
        (true, _) => "error,rowclaim::audit=info",
        // sqlx warns about every broken connection it tests and every slow statement, SQL text
        // and all (a bulk fill is slow by design); an outage is rowclaim's to report, once.
        (false, 0) => "warn,sqlx=error,rowclaim::audit=info",
        (false, 1) => "info,rowclaim=debug,sqlx=error",
        (false, _) => "debug,rowclaim=trace",
    };
    tracing_subscriber::EnvFilter::try_from_env("ROWCLAIM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level))
}
