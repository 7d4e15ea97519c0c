//! What stands between the SDK and the collector: the redaction of every
//! exported string, and the HTTP client the OTLP exporter sends through.

use std::borrow::Cow;
use std::time::Duration;

use bytes::Bytes;
use opentelemetry::trace::Status;
use opentelemetry::{Array, KeyValue, StringValue, Value};
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

use crate::redact::Redactor;

/// A span exporter that passes every string of a span (its name, its
/// attributes, its events' names and attributes, its status) through the
/// redactor before `inner` sees it: span fields and the log lines recorded
/// as span events are the runner's own, but may hold what the log holds
/// (an agent's session id, a ref name, a message), and the log's rule is
/// that nothing leaves unredacted (PROTOCOL.md section 5).
#[derive(Debug)]
pub struct Redacting<E> {
    pub inner: E,
    pub redactor: Redactor,
}

impl<E: SpanExporter> SpanExporter for Redacting<E> {
    fn export(
        &self,
        mut batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        for span in &mut batch {
            redact_span(&self.redactor, span);
        }
        self.inner.export(batch)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

fn redact_span(redactor: &Redactor, span: &mut SpanData) {
    redact_cow(redactor, &mut span.name);
    redact_attributes(redactor, &mut span.attributes);
    for event in &mut span.events.events {
        redact_cow(redactor, &mut event.name);
        redact_attributes(redactor, &mut event.attributes);
    }
    for link in &mut span.links.links {
        redact_attributes(redactor, &mut link.attributes);
    }
    if let Status::Error { description } = &mut span.status {
        redact_cow(redactor, description);
    }
}

fn redact_cow(redactor: &Redactor, text: &mut Cow<'static, str>) {
    let redacted = redactor.redact(text);
    if redacted != **text {
        *text = Cow::Owned(redacted);
    }
}

/// Values only: the keys are the runner's field names.
fn redact_attributes(redactor: &Redactor, attributes: &mut [KeyValue]) {
    for kv in attributes {
        match &mut kv.value {
            Value::String(s) => redact_string(redactor, s),
            Value::Array(Array::String(strings)) => {
                for s in strings {
                    redact_string(redactor, s);
                }
            }
            _ => {}
        }
    }
}

fn redact_string(redactor: &Redactor, s: &mut StringValue) {
    let redacted = redactor.redact(s.as_str());
    if redacted != s.as_str() {
        *s = StringValue::from(redacted);
    }
}

/// The largest answer of a collector that is read (OTLP answers are a few
/// bytes; a partial success names what it refused).
const ANSWER_CAP: usize = 64 * 1024;

/// The exporter's HTTP client: the runner's own reqwest client (its trust
/// roots, `--ca-file`, no redirects), each request run as a task of the
/// runner's runtime. The SDK's batch processors export from threads of
/// their own, outside any runtime, where reqwest cannot run; their own
/// blocking client would be a second TLS stack and a second runtime
/// (opentelemetry-otlp's `reqwest-blocking-client`).
///
/// The runner's client is made after the log (and so after this), which
/// logs how it found its trust roots: it is handed over by
/// [`super::Telemetry::connect`], before the first export is due (the
/// batch processor's delay is seconds).
#[derive(Debug)]
pub struct RuntimeClient {
    pub http: std::sync::Arc<std::sync::OnceLock<reqwest::Client>>,
    pub runtime: tokio::runtime::Handle,
    /// Each request's bound (`OTEL_EXPORTER_OTLP_TIMEOUT`, 10 s unset).
    pub timeout: Duration,
}

#[async_trait::async_trait]
impl HttpClient for RuntimeClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let mut request = reqwest::Request::try_from(request)?;
        *request.timeout_mut() = Some(self.timeout);
        let http = self
            .http
            .get()
            .ok_or("the runner's HTTP client is not made yet")?
            .clone();
        let task = self.runtime.spawn(async move {
            let mut answer = http.execute(request).await?;
            let mut response = Response::builder().status(answer.status());
            let mut body = Vec::new();
            while let Some(chunk) = answer.chunk().await? {
                let room = ANSWER_CAP.saturating_sub(body.len());
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                if room <= chunk.len() {
                    break;
                }
            }
            if let Some(headers) = response.headers_mut() {
                *headers = answer.headers().clone();
            }
            Ok::<_, HttpError>(response.body(Bytes::from(body))?)
        });
        task.await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redact::SecretKind;
    use crate::secret::Secret;
    use opentelemetry::trace::{Event, SpanContext, SpanKind};
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};

    #[test]
    fn every_string_of_a_span_is_redacted() {
        let redactor = Redactor::new();
        redactor.add(
            &Secret::new("hunter2-secret".into()),
            SecretKind::Configured,
        );
        let s = "x hunter2-secret y";
        let mut events = SpanEvents::default();
        events.events.push(Event::new(
            s,
            std::time::SystemTime::now(),
            vec![KeyValue::new("message", s)],
            0,
        ));
        let mut span = SpanData {
            span_context: SpanContext::empty_context(),
            parent_span_id: opentelemetry::trace::SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: s.to_string().into(),
            start_time: std::time::SystemTime::now(),
            end_time: std::time::SystemTime::now(),
            attributes: vec![
                KeyValue::new("a", s),
                KeyValue::new("n", 3),
                KeyValue::new(
                    "list",
                    Value::Array(Array::String(vec![StringValue::from(s)])),
                ),
            ],
            dropped_attributes_count: 0,
            events,
            links: SpanLinks::default(),
            status: Status::error(s),
            instrumentation_scope: Default::default(),
        };
        redact_span(&redactor, &mut span);
        let text = format!("{span:?}");
        assert!(!text.contains("hunter2-secret"), "{text}");
        assert_eq!(span.name, "x [REDACTED] y");
        assert_eq!(span.attributes[1].value, Value::I64(3));
    }
}
