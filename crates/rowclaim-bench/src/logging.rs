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

/// Whether the stderr log may colour (an event's field names): only on a terminal, and not
/// under `NO_COLOR`. A log in a file or a pipe reads `worker="…"`, not escape codes.
pub fn colour() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// [`init_logging`] (or, `quiet`, [`init_quiet_logging`]) with `extra` beside the stderr log.
pub fn init_logging_with(verbose: u8, quiet: bool, extra: Option<ExtraLayer>) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // One layer per arm below: each is typed for the subscriber under it.
    macro_rules! stderr {
        () => {
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(colour())
                // Where a line comes from in the code helps when debugging (-v), not otherwise.
                .with_target(verbose > 0 && !quiet)
        };
    }
    let filter = log_filter(verbose, quiet);
    // Without an extra layer the registry gets none, not a `None` one: an absent layer of
    // `Option` type takes an interest in every span, so that each job's span would be made
    // (and dropped unseen) on every run.
    match extra {
        Some(extra) => tracing_subscriber::registry()
            .with(extra)
            .with(Gated::new(stderr!(), filter, false))
            .init(),
        None => tracing_subscriber::registry()
            .with(Gated::new(stderr!(), filter, true))
            .init(),
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

/// The stderr log's layer behind its filter, without a per-layer filter.
///
/// `tracing-subscriber`'s per-layer filters (`.with_filter`) carry each decision from `enabled`
/// to `on_event` in a thread-local that another `enabled` call can leave stale: after a
/// statement it counts as slow, sqlx asks (through the `log` crate) whether its warning would
/// be written, the filter's `sqlx=error` says no, and the next event on that thread whose
/// callsite is always enabled (a warning such as "rowclaim created table …") was dropped
/// (tokio-rs/tracing#2519). This layer decides at the event itself.
///
/// Alone (`veto`), it filters for the whole subscriber, as a global filter does. Beside another
/// layer with a filter of its own (the OpenTelemetry export) it vetoes nothing, so that the
/// other layer still sees what it wants, and drops at `on_event` what the log's filter does not.
pub struct Gated<L> {
    layer: L,
    filter: tracing_subscriber::EnvFilter,
    veto: bool,
}

impl<L> Gated<L> {
    /// `layer` behind `filter`; `alone` when no other layer shares the subscriber.
    pub fn new(layer: L, filter: tracing_subscriber::EnvFilter, alone: bool) -> Self {
        Gated {
            layer,
            filter,
            veto: alone,
        }
    }
}

mod gated {
    use tracing::span::{Attributes, Id, Record};
    use tracing::subscriber::Interest;
    use tracing::{Event, Metadata, Subscriber};
    use tracing_subscriber::layer::{Context, Layer};
    use tracing_subscriber::registry::LookupSpan;

    use super::Gated;

    impl<S, L> Layer<S> for Gated<L>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        L: Layer<S>,
    {
        fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
            let wanted = Layer::<S>::register_callsite(&self.filter, meta);
            if wanted.is_never() {
                // Alone, nobody wants it; beside another layer, that one may: ask at each event.
                return if self.veto {
                    Interest::never()
                } else {
                    Interest::sometimes()
                };
            }
            self.layer.register_callsite(meta);
            wanted
        }

        fn enabled(&self, meta: &Metadata<'_>, cx: Context<'_, S>) -> bool {
            !self.veto || Layer::<S>::enabled(&self.filter, meta, cx)
        }

        fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
            Layer::<S>::max_level_hint(&self.filter)
        }

        fn on_event(&self, event: &Event<'_>, cx: Context<'_, S>) {
            let wanted =
                self.veto || Layer::<S>::enabled(&self.filter, event.metadata(), cx.clone());
            if wanted {
                self.layer.on_event(event, cx);
            }
        }

        // Spans go to both: the filter follows the ones its directives name, the log keeps
        // their fields.
        fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, cx: Context<'_, S>) {
            self.filter.on_new_span(attrs, id, cx.clone());
            self.layer.on_new_span(attrs, id, cx);
        }

        fn on_record(&self, id: &Id, values: &Record<'_>, cx: Context<'_, S>) {
            Layer::<S>::on_record(&self.filter, id, values, cx.clone());
            self.layer.on_record(id, values, cx);
        }

        fn on_follows_from(&self, id: &Id, follows: &Id, cx: Context<'_, S>) {
            self.layer.on_follows_from(id, follows, cx);
        }

        fn on_enter(&self, id: &Id, cx: Context<'_, S>) {
            Layer::<S>::on_enter(&self.filter, id, cx.clone());
            self.layer.on_enter(id, cx);
        }

        fn on_exit(&self, id: &Id, cx: Context<'_, S>) {
            Layer::<S>::on_exit(&self.filter, id, cx.clone());
            self.layer.on_exit(id, cx);
        }

        fn on_close(&self, id: Id, cx: Context<'_, S>) {
            Layer::<S>::on_close(&self.filter, id.clone(), cx.clone());
            self.layer.on_close(id, cx);
        }

        fn on_id_change(&self, old: &Id, new: &Id, cx: Context<'_, S>) {
            self.layer.on_id_change(old, new, cx);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::{EnvFilter, Layer};

    use super::Gated;

    /// What the log wrote, shared with the test.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if let Ok(mut b) = self.0.lock() {
                b.extend_from_slice(buf);
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Lines {
        fn text(&self) -> String {
            self.0
                .lock()
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default()
        }
    }

    fn log_layer<S>(lines: &Lines) -> impl Layer<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        let lines = lines.clone();
        tracing_subscriber::fmt::layer()
            .with_writer(move || lines.clone())
            .without_time()
            .with_ansi(false)
    }

    /// What sqlx does after a slow statement (a loaded machine makes them): asks, through the
    /// `log` crate, whether its warning about it would be written, which `sqlx=error` turns down.
    fn sqlx_asks() {
        let probe = log::Metadata::builder()
            .level(log::Level::Warn)
            .target("sqlx::query")
            .build();
        let _ = log::Log::enabled(&tracing_log::LogTracer::new(), &probe);
    }

    #[test]
    fn a_warning_after_a_turned_down_question_is_written() {
        let lines = Lines::default();
        let filter = EnvFilter::new("warn,sqlx=error");
        let log = tracing_subscriber::registry().with(Gated::new(log_layer(&lines), filter, false));
        tracing::subscriber::with_default(log, || {
            tracing::warn!("first warning");
            sqlx_asks();
            tracing::warn!("second warning");
            tracing::info!("an info line the filter turns down");
        });
        let text = lines.text();
        assert!(text.contains("first warning"), "{text}");
        assert!(text.contains("second warning"), "{text}");
        assert!(!text.contains("info line"), "{text}");
    }

    #[test]
    fn beside_a_filtered_layer_each_sees_what_its_filter_wants() {
        let (lines, other) = (Lines::default(), Lines::default());
        let filter = EnvFilter::new("warn,sqlx=error");
        let log = tracing_subscriber::registry()
            .with(log_layer(&other).with_filter(EnvFilter::new("info")))
            .with(Gated::new(log_layer(&lines), filter, false));
        tracing::subscriber::with_default(log, || {
            tracing::info!("an info line only the other layer wants");
            sqlx_asks();
            tracing::warn!("a warning for both");
        });
        let (text, other) = (lines.text(), other.text());
        assert!(text.contains("a warning for both"), "{text}");
        assert!(!text.contains("info line"), "{text}");
        assert!(
            other.contains("an info line only the other layer wants"),
            "{other}"
        );
    }
}
