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

#[cfg(feature = "otel")]
mod export;
pub mod metrics;

use std::time::Duration;

#[cfg(feature = "otel")]
use opentelemetry::propagation::{Extractor, TextMapPropagator};
#[cfg(feature = "otel")]
use opentelemetry::trace::TracerProvider as _;
#[cfg(feature = "otel")]
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
#[cfg(feature = "otel")]
use opentelemetry_sdk::metrics::SdkMeterProvider;
#[cfg(feature = "otel")]
use opentelemetry_sdk::propagation::TraceContextPropagator;
#[cfg(feature = "otel")]
use opentelemetry_sdk::trace::SdkTracerProvider;
#[cfg(feature = "otel")]
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
///
/// Built only with the `otel` cargo feature (on by default; the image
/// has it): without it the runner links no exporter, and a platform's
/// endpoint is warned of and ignored.
pub struct Telemetry {
    #[cfg(feature = "otel")]
    traces: Option<SdkTracerProvider>,
    #[cfg(feature = "otel")]
    metrics: Option<SdkMeterProvider>,
    #[cfg(feature = "otel")]
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
        add_endpoint_secrets(&get, redactor);
        let mut problems = settings_problems(&get);
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
        #[cfg(not(feature = "otel"))]
        {
            problems.push(
                "this hosted-boot was built without the otel feature (cargo build --features otel): nothing is exported".into(),
            );
            Setup {
                telemetry: None,
                problems,
            }
        }
        #[cfg(feature = "otel")]
        Self::build(traces, metrics, redactor, problems)
    }

    /// The exporters of the signals asked for.
    #[cfg(feature = "otel")]
    fn build(traces: bool, metrics: bool, redactor: &Redactor, mut problems: Vec<String>) -> Setup {
        let get = |name: &str| std::env::var(name).ok();
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
            .and_then(|built| exporter_of("traces", built, &mut problems))
            .map(|exporter| tracer_provider(exporter, resource.clone(), redactor, &get));
        let metrics = metrics
            .then(|| {
                opentelemetry_otlp::MetricExporter::builder()
                    .with_http()
                    .with_http_client(client())
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .build()
            })
            .and_then(|built| exporter_of("metrics", built, &mut problems))
            .map(|exporter| meter_provider(exporter, resource, &get));
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
        #[cfg(feature = "otel")]
        let _ = self.http.set(http.clone());
        #[cfg(not(feature = "otel"))]
        let _ = http;
    }

    /// The tracing layer that turns the runner's spans into exported spans
    /// (`None` when traces are off).
    #[cfg(feature = "otel")]
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

    /// No layer: a build without the `otel` feature exports nothing.
    #[cfg(not(feature = "otel"))]
    pub fn layer(&self) -> Option<tracing_subscriber::layer::Identity> {
        None
    }

    /// Exports what is left, within [`FLUSH_BOUND`] (on a blocking thread:
    /// the SDK's shutdown waits for its exporter threads, whose requests
    /// run on this runtime).
    #[cfg(not(feature = "otel"))]
    pub async fn shutdown(self) {}

    /// As above, with the exporters.
    #[cfg(feature = "otel")]
    pub async fn shutdown(self) {
        // Plain threads, both signals at once: the runtime's own shutdown
        // would wait for a blocking task that outlived the bound, and a
        // collector that never answers must cost the exit 1 s, not 2.
        let (done, flushed) = tokio::sync::mpsc::channel::<()>(2);
        let mut flushing = 0;
        if let Some(traces) = self.traces {
            flushing += 1;
            let done = done.clone();
            std::thread::spawn(move || {
                let _ = traces.shutdown_with_timeout(FLUSH_BOUND);
                let _ = done.try_send(());
            });
        }
        if let Some(metrics) = self.metrics {
            flushing += 1;
            let done = done.clone();
            std::thread::spawn(move || {
                let _ = metrics.shutdown_with_timeout(FLUSH_BOUND);
                let _ = done.try_send(());
            });
        }
        drop(done);
        let mut flushed = flushed;
        let all = async {
            for _ in 0..flushing {
                if flushed.recv().await.is_none() {
                    break;
                }
            }
        };
        if tokio::time::timeout(FLUSH_BOUND, all).await.is_err() {
            tracing::debug!(
                "telemetry not flushed within {} ms",
                FLUSH_BOUND.as_millis()
            );
        }
    }
}

#[cfg(feature = "otel")]
/// The exporter `built` for `signal`, or its build error among the
/// problems (an endpoint no URL parser takes, say).
fn exporter_of<T>(
    signal: &str,
    built: Result<T, opentelemetry_otlp::ExporterBuildError>,
    problems: &mut Vec<String>,
) -> Option<T> {
    built
        .map_err(|e| problems.push(format!("{signal} are not exported: {e}")))
        .ok()
}

#[cfg(feature = "otel")]
/// The traces' provider: spans redacted, then batched to `exporter`.
fn tracer_provider(
    exporter: opentelemetry_otlp::SpanExporter,
    resource: opentelemetry_sdk::Resource,
    redactor: &Redactor,
    get: &dyn Fn(&str) -> Option<String>,
) -> SdkTracerProvider {
    let exporter = export::Redacting {
        inner: exporter,
        redactor: redactor.clone(),
    };
    let config = opentelemetry_sdk::trace::BatchConfigBuilder::default()
        .with_scheduled_delay(at_least(get, "OTEL_BSP_SCHEDULE_DELAY", MIN_INTERVAL))
        .build();
    let processor = opentelemetry_sdk::trace::BatchSpanProcessor::builder(exporter)
        .with_batch_config(config)
        .build();
    SdkTracerProvider::builder()
        .with_resource(resource)
        .with_span_processor(processor)
        .build()
}

#[cfg(feature = "otel")]
/// The metrics' provider: read and exported every interval.
fn meter_provider(
    exporter: opentelemetry_otlp::MetricExporter,
    resource: opentelemetry_sdk::Resource,
    get: &dyn Fn(&str) -> Option<String>,
) -> SdkMeterProvider {
    let interval = at_least(get, "OTEL_METRIC_EXPORT_INTERVAL", MIN_INTERVAL);
    let reader = opentelemetry_sdk::metrics::PeriodicReader::builder(exporter)
        .with_interval(interval)
        .build();
    SdkMeterProvider::builder()
        .with_resource(resource)
        .with_reader(reader)
        .build()
}

/// The shortest export interval taken from `OTEL_BSP_SCHEDULE_DELAY` and
/// `OTEL_METRIC_EXPORT_INTERVAL`: the SDK takes 0 as it is, and its export
/// threads then spin a core or flood the collector.
const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// The interval of `var` (milliseconds, the specification's unit), at
/// least `min`; the SDK's default (5 s for spans, 60 s for metrics) when
/// unset or not a number.
#[cfg_attr(not(feature = "otel"), allow(dead_code))]
fn at_least(get: &dyn Fn(&str) -> Option<String>, var: &str, min: Duration) -> Duration {
    let default = if var == "OTEL_BSP_SCHEDULE_DELAY" {
        Duration::from_secs(5)
    } else {
        Duration::from_secs(60)
    };
    get(var)
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(default, |ms| Duration::from_millis(ms).max(min))
}

/// Warnings for the specification's variables the SDK would take silently
/// in a way the platform did not mean: an interval under [`MIN_INTERVAL`],
/// a sampler it does not know, a timeout of 0.
fn settings_problems(get: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let mut problems = Vec::new();
    for var in ["OTEL_BSP_SCHEDULE_DELAY", "OTEL_METRIC_EXPORT_INTERVAL"] {
        if let Some(ms) = get(var).and_then(|v| v.trim().parse::<u64>().ok())
            && Duration::from_millis(ms) < MIN_INTERVAL
        {
            problems.push(format!(
                "{var}={ms} is below {} ms; {} ms is used (an interval of 0 would spin a core or flood the collector)",
                MIN_INTERVAL.as_millis(),
                MIN_INTERVAL.as_millis()
            ));
        }
    }
    const SAMPLERS: [&str; 6] = [
        "always_on",
        "always_off",
        "traceidratio",
        "parentbased_always_on",
        "parentbased_always_off",
        "parentbased_traceidratio",
    ];
    if let Some(sampler) = get("OTEL_TRACES_SAMPLER")
        && !SAMPLERS.contains(&sampler.trim())
    {
        problems.push(format!(
            "OTEL_TRACES_SAMPLER={sampler:?} is not one the runner takes ({}); parentbased_always_on is used",
            SAMPLERS.join(", ")
        ));
    }
    if let Some(timeout) = get("OTEL_EXPORTER_OTLP_TIMEOUT")
        && timeout.trim().parse::<u64>().ok().is_none_or(|ms| ms == 0)
    {
        problems.push(format!(
            "OTEL_EXPORTER_OTLP_TIMEOUT={timeout:?} is not a positive number of milliseconds; 10000 is used"
        ));
    }
    problems
}

#[cfg(feature = "otel")]
/// `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds), 10 s when unset or bad.
fn export_timeout(get: &dyn Fn(&str) -> Option<String>) -> Duration {
    get("OTEL_EXPORTER_OTLP_TIMEOUT")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map_or(Duration::from_secs(10), Duration::from_millis)
}

#[cfg(feature = "otel")]
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

/// The variables that name the collector: a URL's user info there is a
/// credential too.
pub const ENDPOINT_VARS: [&str; 4] = [
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
];

/// The user info of a URL (`user:password` before the host), read from
/// the text as it is (a URL no parser takes, whose build error quotes it
/// whole, included).
pub fn user_info(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    authority
        .rsplit_once('@')
        .map(|(info, _)| info)
        .filter(|i| !i.is_empty())
}

/// Adds the user info of each endpoint variable (whole, and its password)
/// to the redactor: the exporter's build error quotes the URL whole.
fn add_endpoint_secrets(get: &dyn Fn(&str) -> Option<String>, redactor: &Redactor) {
    for var in ENDPOINT_VARS {
        let Some(url) = get(var) else { continue };
        let Some(info) = user_info(&url) else {
            continue;
        };
        redactor.add(&Secret::new(info.to_string()), SecretKind::Configured);
        if let Some((_, password)) = info.split_once(':') {
            redactor.add(&Secret::new(password.to_string()), SecretKind::Configured);
        }
    }
}

/// Whether a trace context value may go on: printable ASCII only (W3C's
/// alphabet for both headers), and a `tracestate` of at most 512 bytes
/// (W3C's limit a vendor may rely on). A control character would end the
/// agent's start (`execve` takes no NUL) or forge a header line.
fn acceptable(value: &str) -> bool {
    value.len() <= 512 && value.bytes().all(|b| (0x20..=0x7e).contains(&b))
}

/// A W3C trace context read from `traceparent` (and `tracestate`).
#[cfg(feature = "otel")]
struct Carrier<'a> {
    traceparent: &'a str,
    tracestate: Option<&'a str>,
}

#[cfg(feature = "otel")]
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
    if !acceptable(traceparent) {
        return;
    }
    #[cfg(feature = "otel")]
    {
        let carrier = Carrier {
            traceparent,
            tracestate: tracestate.filter(|s| acceptable(s)),
        };
        let context = TraceContextPropagator::new().extract(&carrier);
        if opentelemetry::trace::TraceContextExt::span(&context)
            .span_context()
            .is_valid()
        {
            let _ = span.set_parent(context);
        }
    }
    #[cfg(not(feature = "otel"))]
    let _ = (span, tracestate);
}

/// Adds `span`'s W3C trace context to a request's headers (nothing when
/// traces are off: its context is then invalid).
pub fn inject(span: &tracing::Span, headers: &mut reqwest::header::HeaderMap) {
    #[cfg(feature = "otel")]
    TraceContextPropagator::new().inject_context(
        &span.context(),
        &mut opentelemetry_http::HeaderInjector(headers),
    );
    #[cfg(not(feature = "otel"))]
    let _ = (span, headers);
}

/// `span`'s trace context as the agent's variables (`TRACEPARENT`, and
/// `TRACESTATE` when it has one); empty when traces are off.
pub fn agent_context(span: &tracing::Span) -> Vec<(&'static str, String)> {
    let mut vars = Vec::new();
    #[cfg(feature = "otel")]
    {
        let mut fields = std::collections::HashMap::new();
        TraceContextPropagator::new().inject_context(&span.context(), &mut fields);
        if let Some(parent) = fields.remove("traceparent").filter(|p| acceptable(p)) {
            vars.push((TRACEPARENT_VAR, parent));
            if let Some(state) = fields
                .remove("tracestate")
                .filter(|s| !s.is_empty() && acceptable(s))
            {
                vars.push((TRACESTATE_VAR, state));
            }
        }
    }
    #[cfg(not(feature = "otel"))]
    let _ = span;
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
    fn user_info_is_found_in_any_url() {
        assert_eq!(user_info("http://u:p@h:4318/x"), Some("u:p"));
        assert_eq!(user_info("http://otel:pw@bad host:4318"), Some("otel:pw"));
        assert_eq!(user_info("https://h/v1/traces?a=b@c"), None);
        assert_eq!(user_info("h:4318"), None);
    }

    #[test]
    fn zero_intervals_are_raised_and_said() {
        let zero = [
            ("OTEL_BSP_SCHEDULE_DELAY", "0"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "0"),
        ];
        assert_eq!(
            at_least(&env(&zero), "OTEL_BSP_SCHEDULE_DELAY", MIN_INTERVAL),
            MIN_INTERVAL
        );
        assert_eq!(settings_problems(&env(&zero)).len(), 2);
        let none: &[(&str, &str)] = &[];
        assert_eq!(
            at_least(&env(none), "OTEL_METRIC_EXPORT_INTERVAL", MIN_INTERVAL),
            Duration::from_secs(60)
        );
        let bad = [
            ("OTEL_TRACES_SAMPLER", "not_a_sampler"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "0"),
        ];
        let problems = settings_problems(&env(&bad));
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("not_a_sampler"), "{problems:?}");
    }

    #[test]
    fn only_printable_trace_context_goes_on() {
        assert!(acceptable("vendor=a"));
        assert!(!acceptable("vendor=a\u{0}b"));
        assert!(!acceptable("a\nb"));
        assert!(!acceptable(&"a".repeat(513)));
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
