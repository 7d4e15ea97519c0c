//! OpenTelemetry traces and metrics (issue 40), off unless the
//! specification's variables ask for them: an OTLP endpoint
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`, or a signal's own
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `…_METRICS_ENDPOINT`). The rest
//! of the specification's variables (`OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`,
//! `OTEL_METRIC_EXPORT_INTERVAL`, `OTEL_EXPORTER_OTLP_HEADERS`, …) are read
//! by the SDK itself. OTLP over HTTP with protobuf only (`http/protobuf`).
//!
//! The spans are the runner's `tracing` spans (boot, steps, turns,
//! coordinator requests, git, the agent's process), exported through
//! tracing-opentelemetry; W3C trace context goes out on every coordinator
//! request ([`inject`]) and to the agent ([`agent_context`]), and comes in
//! from `TRACEPARENT` (the boot's parent) and a pending turn's
//! `traceparent` (that turn's parent).

mod export;
pub mod metrics;

use std::time::Duration;

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::redact::{Redactor, SecretKind};
use crate::secret::Secret;

/// The variables that carry the collector's request headers (usually its
/// credentials): secrets, redacted, and kept from the agent unless the
/// platform passes them on (`--agent-otel-headers`).
pub const HEADER_VARS: [&str; 4] = [
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
    "OTEL_EXPORTER_OTLP_LOGS_HEADERS",
];

/// The W3C trace context variables: the sandbox's (the boot's parent) and,
/// per turn, the agent's (its turn's agent span).
pub const TRACEPARENT_VAR: &str = "TRACEPARENT";
/// The vendor part of a W3C trace context, beside [`TRACEPARENT_VAR`].
pub const TRACESTATE_VAR: &str = "TRACESTATE";

/// How long the exit's flush may take; it comes after everything the stop
/// budget bounds (PROTOCOL.md 4.4), never out of it.
pub const FLUSH_BOUND: Duration = Duration::from_secs(1);

/// The exporters, when telemetry is on. Dropping it without [`shutdown`]
/// loses what is not yet exported.
///
/// [`shutdown`]: Telemetry::shutdown
pub struct Telemetry {
    traces: Option<SdkTracerProvider>,
    metrics: Option<SdkMeterProvider>,
    http: std::sync::Arc<std::sync::OnceLock<reqwest::Client>>,
}

/// What [`Telemetry::from_env`] found: telemetry (or none), and what to
/// warn of once the log is up (a variable it could not use).
pub struct Setup {
    /// The exporters, when a signal is asked for and could be built.
    pub telemetry: Option<Telemetry>,
    /// A sentence per variable that could not be used.
    pub problems: Vec<String>,
}

/// Whether a signal is asked for: an endpoint for it, and its exporter
/// not `none`.
fn wanted(get: &dyn Fn(&str) -> Option<String>, signal: &str) -> bool {
    let set = |name: &str| get(name).is_some_and(|v| !v.trim().is_empty());
    let exporter = get(&format!("OTEL_{signal}_EXPORTER"));
    (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set(&format!("OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")))
        && exporter.is_none_or(|e| e.trim() != "none")
}

/// The protocol problem of a signal, if its protocol is not ours.
fn protocol_problem(get: &dyn Fn(&str) -> Option<String>, signal: &str) -> Option<String> {
    let var = format!("OTEL_EXPORTER_OTLP_{signal}_PROTOCOL");
    let (name, value) = match get(&var) {
        Some(v) => (var, v),
        None => (
            "OTEL_EXPORTER_OTLP_PROTOCOL".to_string(),
            get("OTEL_EXPORTER_OTLP_PROTOCOL")?,
        ),
    };
    let value = value.trim();
    (!value.is_empty() && value != "http/protobuf").then(|| {
        format!(
            "{name}={value:?} is not supported: the runner exports OTLP over HTTP with protobuf only; set it to http/protobuf (a collector's port 4318) or unset it. {} are not exported",
            signal.to_lowercase()
        )
    })
}

impl Telemetry {
    /// Reads the specification's variables from the process environment
    /// and builds the exporters that are asked for, sending on the current
    /// runtime once [`Telemetry::connect`] gives them the HTTP client. The
    /// header variables' values are added to `redactor` whether or not
    /// telemetry is on (the agent may get them).
    pub fn from_env(redactor: &Redactor) -> Setup {
        let get = |name: &str| std::env::var(name).ok();
        add_header_secrets(&get, redactor);
        let mut problems = Vec::new();
        if get("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Setup {
                telemetry: None,
                problems,
            };
        }
        let mut signal = |name: &str| {
            if !wanted(&get, name) {
                return false;
            }
            match protocol_problem(&get, name) {
                Some(problem) => {
                    problems.push(problem);
                    false
                }
                None => true,
            }
        };
        let (traces, metrics) = (signal("TRACES"), signal("METRICS"));
        if !traces && !metrics {
            return Setup {
                telemetry: None,
                problems,
            };
        }
        let http = std::sync::Arc::new(std::sync::OnceLock::new());
        let client = || export::RuntimeClient {
            http: http.clone(),
            runtime: tokio::runtime::Handle::current(),
            timeout: export_timeout(&get),
        };
        let resource = resource(&get);
        let traces = traces
            .then(|| {
                opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_http_client(client())
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .build()
            })
            .and_then(|built| {
                built
                    .map_err(|e| problems.push(format!("traces are not exported: {e}")))
                    .ok()
            })
            .map(|exporter| {
                SdkTracerProvider::builder()
                    .with_resource(resource.clone())
                    .with_batch_exporter(export::Redacting {
                        inner: exporter,
                        redactor: redactor.clone(),
                    })
                    .build()
            });
        let metrics = metrics
            .then(|| {
                opentelemetry_otlp::MetricExporter::builder()
                    .with_http()
                    .with_http_client(client())
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .build()
            })
            .and_then(|built| {
                built
                    .map_err(|e| problems.push(format!("metrics are not exported: {e}")))
                    .ok()
            })
            .map(|exporter| {
                SdkMeterProvider::builder()
                    .with_resource(resource)
                    .with_periodic_exporter(exporter)
                    .build()
            });
        if let Some(provider) = &metrics {
            metrics::install(provider);
        }
        let telemetry = (traces.is_some() || metrics.is_some()).then_some(Telemetry {
            traces,
            metrics,
            http,
        });
        Setup {
            telemetry,
            problems,
        }
    }

    /// Hands the exporters the runner's HTTP client (its trust roots).
    pub fn connect(&self, http: &reqwest::Client) {
        let _ = self.http.set(http.clone());
    }

    /// The tracing layer that turns the runner's spans into exported spans
    /// (`None` when traces are off).
    pub fn layer<S>(
        &self,
    ) -> Option<tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::SdkTracer>>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        let tracer = self.traces.as_ref()?.tracer("hosted-boot");
        Some(
            tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_location(false)
                .with_threads(false)
                .with_tracked_inactivity(false),
        )
    }

    /// Exports what is left, within [`FLUSH_BOUND`] (on a blocking thread:
    /// the SDK's shutdown waits for its exporter threads, whose requests
    /// run on this runtime).
    pub async fn shutdown(self) {
        let flush = tokio::task::spawn_blocking(move || {
            if let Some(traces) = self.traces {
                let _ = traces.shutdown_with_timeout(FLUSH_BOUND);
            }
            if let Some(metrics) = self.metrics {
                let _ = metrics.shutdown_with_timeout(FLUSH_BOUND);
            }
        });
        if tokio::time::timeout(FLUSH_BOUND, flush).await.is_err() {
            tracing::debug!(
                "telemetry not flushed within {} ms",
                FLUSH_BOUND.as_millis()
            );
        }
    }
}

/// `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds), 10 s when unset or bad.
fn export_timeout(get: &dyn Fn(&str) -> Option<String>) -> Duration {
    get("OTEL_EXPORTER_OTLP_TIMEOUT")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map_or(Duration::from_secs(10), Duration::from_millis)
}

/// The SDK's resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`),
/// named `hosted-boot` when neither names the service.
fn resource(get: &dyn Fn(&str) -> Option<String>) -> opentelemetry_sdk::Resource {
    let named = get("OTEL_SERVICE_NAME").is_some_and(|v| !v.trim().is_empty())
        || get("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|v| v.contains("service.name="));
    let builder = opentelemetry_sdk::Resource::builder().with_attribute(
        opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
    );
    if named {
        builder.build()
    } else {
        builder.with_service_name("hosted-boot").build()
    }
}

/// Adds each header value of the header variables (`key=value,…`, values
/// percent-encoded by the specification) to the redactor, encoded and
/// decoded, and each variable's whole value.
fn add_header_secrets(get: &dyn Fn(&str) -> Option<String>, redactor: &Redactor) {
    for var in HEADER_VARS {
        let Some(value) = get(var) else { continue };
        redactor.add(&Secret::new(value.clone()), SecretKind::Configured);
        for pair in value.split(',') {
            let Some((_, v)) = pair.split_once('=') else {
                continue;
            };
            let v = v.trim();
            redactor.add(&Secret::new(v.to_string()), SecretKind::Configured);
            let decoded =
                url::form_urlencoded::parse(format!("v={}", v.replace('+', "%2B")).as_bytes())
                    .next()
                    .map(|(_, d)| d.into_owned());
            if let Some(decoded) = decoded.filter(|d| d != v) {
                redactor.add(&Secret::new(decoded), SecretKind::Configured);
            }
        }
    }
}

/// A W3C trace context read from `traceparent` (and `tracestate`).
struct Carrier<'a> {
    traceparent: &'a str,
    tracestate: Option<&'a str>,
}

impl Extractor for Carrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => Some(self.traceparent),
            "tracestate" => self.tracestate,
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}

/// Makes `span` continue the trace of `traceparent` (and `tracestate`):
/// the sandbox's `TRACEPARENT` for the boot, a pending turn's for its turn.
/// A value that is not a W3C trace context is ignored (the span starts a
/// trace of its own), as the specification says of a bad header.
pub fn continue_trace(span: &tracing::Span, traceparent: &str, tracestate: Option<&str>) {
    let carrier = Carrier {
        traceparent,
        tracestate,
    };
    let context = TraceContextPropagator::new().extract(&carrier);
    if opentelemetry::trace::TraceContextExt::span(&context)
        .span_context()
        .is_valid()
    {
        let _ = span.set_parent(context);
    }
}

/// Adds `span`'s W3C trace context to a request's headers (nothing when
/// traces are off: its context is then invalid).
pub fn inject(span: &tracing::Span, headers: &mut reqwest::header::HeaderMap) {
    let context = span.context();
    TraceContextPropagator::new()
        .inject_context(&context, &mut opentelemetry_http::HeaderInjector(headers));
}

/// `span`'s trace context as the agent's variables (`TRACEPARENT`, and
/// `TRACESTATE` when it has one); empty when traces are off.
pub fn agent_context(span: &tracing::Span) -> Vec<(&'static str, String)> {
    let mut fields = std::collections::HashMap::new();
    TraceContextPropagator::new().inject_context(&span.context(), &mut fields);
    let mut vars = Vec::new();
    if let Some(parent) = fields.remove("traceparent") {
        vars.push((TRACEPARENT_VAR, parent));
    }
    if let Some(state) = fields.remove("tracestate").filter(|s| !s.is_empty()) {
        vars.push((TRACESTATE_VAR, state));
    }
    vars
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn a_signal_is_wanted_only_with_an_endpoint_and_not_none() {
        let none: &[(&str, &str)] = &[];
        assert!(!wanted(&env(none), "TRACES"));
        let all = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")];
        assert!(wanted(&env(&all), "TRACES") && wanted(&env(&all), "METRICS"));
        let one = [("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c/v1/traces")];
        assert!(wanted(&env(&one), "TRACES") && !wanted(&env(&one), "METRICS"));
        let off = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"),
            ("OTEL_METRICS_EXPORTER", "none"),
        ];
        assert!(wanted(&env(&off), "TRACES") && !wanted(&env(&off), "METRICS"));
        let blank = [("OTEL_EXPORTER_OTLP_ENDPOINT", " ")];
        assert!(!wanted(&env(&blank), "TRACES"));
    }

    #[test]
    fn only_http_protobuf_is_spoken() {
        let grpc = [("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")];
        let problem = protocol_problem(&env(&grpc), "TRACES").unwrap();
        assert!(
            problem.contains("OTEL_EXPORTER_OTLP_PROTOCOL=\"grpc\""),
            "{problem}"
        );
        assert!(problem.contains("http/protobuf"), "{problem}");
        let ours = [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
        ];
        assert_eq!(protocol_problem(&env(&ours), "TRACES"), None);
        assert!(protocol_problem(&env(&ours), "METRICS").is_some());
    }

    #[test]
    fn header_values_are_secrets_encoded_and_decoded() {
        let redactor = Redactor::new();
        let vars = [(
            "OTEL_EXPORTER_OTLP_HEADERS",
            "Authorization=Basic%20dXNlcjpwYXNz,x-api-key=key-0123456789",
        )];
        add_header_secrets(&env(&vars), &redactor);
        for text in [
            "Basic%20dXNlcjpwYXNz",
            "Basic dXNlcjpwYXNz",
            "key-0123456789",
        ] {
            assert!(
                !redactor.redact(&format!("a {text} b")).contains(text),
                "{text}"
            );
        }
    }

    #[test]
    fn a_traceparent_is_continued_and_a_bad_one_ignored() {
        // Without a tracer the span's context is what was set as its
        // parent, if anything: nothing here, for both.
        let span = tracing::Span::none();
        continue_trace(&span, "00-zz-zz-01", None);
        assert!(agent_context(&span).is_empty());
    }
}
