//! The command's log on stderr, in the voice of everything else it says: `rowclaim: …`, with
//! the level word only for warnings and errors (`rowclaim: warning: …`), no timestamp (the
//! audit trail of `dashboard` keeps one), and the event's origin only from `-v` on. The library's
//! events (an outage, a table it created) then read as the command's own lines, not a crash.

use std::fmt;

use rowclaim_bench::{ExtraLayer, Gated, AUDIT};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Installs the stderr log (filtered by `-v`, `--quiet` and `ROWCLAIM_LOG`) and `extra` beside
/// it (the OpenTelemetry export).
pub fn init(verbose: u8, quiet: bool, extra: Option<ExtraLayer>) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let colour = rowclaim_bench::colour();
    // One layer per arm below: each is typed for the subscriber under it.
    macro_rules! stderr {
        () => {
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(colour)
                .event_format(Voice {
                    origin: verbose > 0 && !quiet,
                })
        };
    }
    let filter = rowclaim_bench::log_filter(verbose, quiet);
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

/// One event as one `rowclaim: …` line.
struct Voice {
    /// Whether to name the event's target (`[rowclaim::worker]`), from `-v` on.
    origin: bool,
}

impl<S, N> FormatEvent<S, N> for Voice
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        write!(w, "rowclaim: ")?;
        if meta.target() == AUDIT {
            let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
            write!(w, "audit {now}: ")?;
        }
        match *meta.level() {
            Level::ERROR => write!(w, "error: ")?,
            Level::WARN => write!(w, "warning: ")?,
            _ => {}
        }
        if self.origin {
            write!(w, "[{}] ", meta.target())?;
        }
        ctx.format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}
