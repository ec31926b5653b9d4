//! OpenTelemetry export of the library's spans (the `otel` feature): one `job` span per job run,
//! with its row id, claim token, source, queue, kind and attempt; `claim` spans at debug level.
//!
//! Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set;
//! then spans go over OTLP/HTTP (protobuf) in batches. The standard `OTEL_*` variables configure
//! the exporter and the service name (default `rowclaim`); `ROWCLAIM_OTEL`, a tracing filter,
//! chooses the spans (default `rowclaim=info`; `rowclaim=debug` adds the claims).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::Layer;

use crate::error::CliError;

/// Flushes the spans not sent yet when the command ends.
pub struct Flush(SdkTracerProvider);

impl Flush {
    pub fn now(self) {
        if let Err(e) = self.0.shutdown() {
            tracing::warn!("sending the last spans to the OpenTelemetry collector: {e}");
        }
    }
}

/// The export layer, when an OTLP endpoint is set.
pub fn layer() -> Result<Option<(rowclaim_bench::ExtraLayer, Flush)>, CliError> {
    let set = |name| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    if !set("OTEL_EXPORTER_OTLP_ENDPOINT") && !set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| CliError::BadInput(format!("OTEL_EXPORTER_OTLP_ENDPOINT: {e}")))?;
    let mut resource = Resource::builder();
    if !set("OTEL_SERVICE_NAME") {
        resource = resource.with_service_name("rowclaim");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let filter = tracing_subscriber::EnvFilter::try_from_env("ROWCLAIM_OTEL")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("rowclaim=info"));
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("rowclaim"))
        .with_filter(filter)
        .boxed();
    Ok(Some((layer, Flush(provider))))
}
