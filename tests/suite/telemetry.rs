//! Telemetry (issue 40): the real binary against the reference coordinator
//! and a real OTLP/HTTP receiver on loopback, whose requests are decoded
//! with the protocol's own definitions (`opentelemetry-proto`). A
//! three-turn session: the span tree (the sandbox's `TRACEPARENT` continued
//! by the boot, a `pendingTurn.traceparent` by its turn, a failed turn's
//! error status), the `traceparent` each coordinator request carried equal
//! to an exported span's context, the agent's `TRACEPARENT`, the
//! collector's headers used but withheld from the agent, metrics, and no
//! secret in anything the receiver got. A receiver that never answers
//! changes nothing in the session.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::HeaderMap;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

use super::support::{Runner, Sandbox, assert_no_secret};

/// A connector's value the agent prints.
const CONNECTOR_SECRET: &str = "telemetry-connector-secret-5d1f";
/// The collector's credential, in `OTEL_EXPORTER_OTLP_HEADERS`.
const COLLECTOR_SECRET: &str = "otel-collector-secret-93ab";
/// The sandbox's trace context.
const SANDBOX_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SANDBOX_PARENT: &str = "00f067aa0ba902b7";
/// The coordinator's trace context of turn 2.
const TURN_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const TURN_PARENT: &str = "b7ad6b7169203331";

/// What the receiver got: path, headers, body.
pub(super) type Received = Arc<Mutex<Vec<(String, HeaderMap, Bytes)>>>;

/// An OTLP/HTTP receiver on loopback: answers every export 200 with an
/// empty (valid) protobuf answer, or never (`answer` false).
pub(super) async fn receiver(answer: bool) -> (String, Received) {
    let received: Received = Arc::default();
    let store = received.clone();
    let app = axum::Router::new().fallback(
        move |uri: axum::http::Uri, headers: HeaderMap, body: Bytes| {
            let store = store.clone();
            async move {
                store
                    .lock()
                    .unwrap()
                    .push((uri.path().to_string(), headers, body));
                if !answer {
                    std::future::pending::<()>().await;
                }
                (
                    [(axum::http::header::CONTENT_TYPE, "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Every span the receiver got.
pub(super) fn spans(received: &Received) -> Vec<Span> {
    let mut all = Vec::new();
    for (path, _, body) in received.lock().unwrap().iter() {
        if path == "/v1/traces" {
            let request = ExportTraceServiceRequest::decode(body.clone()).unwrap();
            for resource in request.resource_spans {
                for scope in resource.scope_spans {
                    all.extend(scope.spans);
                }
            }
        }
    }
    all
}

/// Every metric name the receiver got.
fn metric_names(received: &Received) -> Vec<String> {
    let mut names = Vec::new();
    for (path, _, body) in received.lock().unwrap().iter() {
        if path == "/v1/metrics" {
            let request = ExportMetricsServiceRequest::decode(body.clone()).unwrap();
            for resource in request.resource_metrics {
                for scope in resource.scope_metrics {
                    names.extend(scope.metrics.into_iter().map(|m| m.name));
                }
            }
        }
    }
    names
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    let value = span.attributes.iter().find(|kv| kv.key == key)?;
    Some(match value.value.as_ref()?.value.as_ref()? {
        any_value::Value::StringValue(s) => s.clone(),
        any_value::Value::IntValue(i) => i.to_string(),
        any_value::Value::BoolValue(b) => b.to_string(),
        other => format!("{other:?}"),
    })
}

/// The one span named `name` whose `key` is `value`.
fn find<'a>(spans: &'a [Span], name: &str, key: &str, value: &str) -> &'a Span {
    let found: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == name && attribute(s, key).as_deref() == Some(value))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "spans {name} with {key}={value}: {found:#?}"
    );
    found[0]
}

/// The spans whose parent is `parent`.
fn children<'a>(spans: &'a [Span], parent: &Span) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|s| s.parent_span_id == parent.span_id && s.trace_id == parent.trace_id)
        .collect()
}

/// The span tree as text (names and a few attributes, children indented),
/// printed by the test for README's sample.
fn tree(spans: &[Span]) -> String {
    fn walk(spans: &[Span], span: &Span, depth: usize, out: &mut String) {
        let keys = [
            "run_id",
            "route",
            "attempt",
            "git_ref",
            "outcome",
            "exit_code",
        ];
        let attrs: Vec<String> = keys
            .iter()
            .filter_map(|k| attribute(span, k).map(|v| format!("{k}={v}")))
            .collect();
        out.push_str(&format!(
            "{}{} {}\n",
            "  ".repeat(depth),
            span.name,
            attrs.join(" ")
        ));
        let mut kids = children(spans, span);
        kids.sort_by_key(|s| s.start_time_unix_nano);
        for kid in kids {
            walk(spans, kid, depth + 1, out);
        }
    }
    let ids: std::collections::HashSet<(&[u8], &[u8])> = spans
        .iter()
        .map(|s| (s.trace_id.as_slice(), s.span_id.as_slice()))
        .collect();
    let mut roots: Vec<&Span> = spans
        .iter()
        .filter(|s| !ids.contains(&(s.trace_id.as_slice(), s.parent_span_id.as_slice())))
        .collect();
    roots.sort_by_key(|s| s.start_time_unix_nano);
    let mut out = String::new();
    for root in roots {
        walk(spans, root, 0, &mut out);
    }
    out
}

/// The agent: records its trace context and whether it saw the
/// collector's headers; run-3 fails.
const AGENT: &str = r#"
echo "$ORIZU_RUN_ID ${TRACEPARENT:-none} ${OTEL_EXPORTER_OTLP_HEADERS:-withheld}" >> "$AGENT_OUT/trace-context"
if [ "$ORIZU_RUN_ID" = run-3 ]; then
  echo '{"type":"message","text":"failing"}'
  exit 3
fi
echo "$ORIZU_RUN_ID" > "file-$ORIZU_RUN_ID.txt"
echo "{\"type\":\"message\",\"text\":\"done $SECRET_CONNECTOR\"}"
"#;

fn runner(sb: &Sandbox, endpoint: &str) -> Runner {
    let mut cmd = sb.runner(&sb.script(AGENT));
    cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .env(
            "OTEL_EXPORTER_OTLP_HEADERS",
            format!("authorization=Bearer%20{COLLECTOR_SECRET}"),
        )
        // Exports within the test's waits (the defaults: 5 s, 60 s).
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("OTEL_METRIC_EXPORT_INTERVAL", "200")
        .env(
            "TRACEPARENT",
            format!("00-{SANDBOX_TRACE}-{SANDBOX_PARENT}-01"),
        );
    Runner::reading(cmd.spawn().unwrap())
}

#[tokio::test]
async fn a_session_is_one_trace_and_its_requests_carry_it() {
    let (endpoint, received) = receiver(true).await;
    let sb = Sandbox::with_connectors(&[("SECRET_CONNECTOR", CONNECTOR_SECRET)]).await;
    let runner = runner(&sb, &endpoint);
    sb.wait_sealed("run-1").await;
    let run2 = sb
        .coordinator
        .queue_traced_turn("second", &format!("00-{TURN_TRACE}-{TURN_PARENT}-01"));
    sb.wait_sealed(&run2).await;
    let run3 = sb.coordinator.queue_turn("third", None);
    let snap = sb.wait_sealed(&run3).await;
    let (status, output) = runner.finish().await;
    // A failed turn ends the boot, reported (PROTOCOL.md 4.2).
    assert_eq!(status.code(), Some(1), "{output}");
    let finish = snap.run(&run3).unwrap().finish.clone().unwrap();
    assert_eq!(finish.status.as_str(), "failed");

    let spans = spans(&received);
    println!("{}", tree(&spans));
    // The boot continues the sandbox's trace.
    let boot = find(&spans, "boot", "session_id", &sb.coordinator.session_id());
    assert_eq!(hex(&boot.trace_id), SANDBOX_TRACE);
    assert_eq!(hex(&boot.parent_span_id), SANDBOX_PARENT);
    assert_eq!(attribute(boot, "exit_code").as_deref(), Some("1"));
    // Three turns: the first and third in the boot's trace, under it; the
    // second continues the coordinator's trace of that turn.
    let turn1 = find(&spans, "turn", "run_id", "run-1");
    let turn2 = find(&spans, "turn", "run_id", &run2);
    let turn3 = find(&spans, "turn", "run_id", &run3);
    assert_eq!(turn1.parent_span_id, boot.span_id);
    assert_eq!(turn3.parent_span_id, boot.span_id);
    assert_eq!(hex(&turn2.trace_id), TURN_TRACE);
    assert_eq!(hex(&turn2.parent_span_id), TURN_PARENT);
    assert_eq!(attribute(turn1, "outcome").as_deref(), Some("succeeded"));
    assert_eq!(attribute(turn3, "outcome").as_deref(), Some("failed"));
    // OTLP's STATUS_CODE_ERROR.
    assert_eq!(turn3.status.as_ref().map(|s| s.code), Some(2), "{turn3:#?}");
    assert_ne!(turn1.status.as_ref().map(|s| s.code), Some(2), "{turn1:#?}");
    // Each turn's steps: the agent (its process below it) and the harvest
    // (its push below it).
    for turn in [turn1, turn2, turn3] {
        let names: Vec<&str> = children(&spans, turn)
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        for step in ["agent", "harvest"] {
            assert!(names.contains(&step), "{step} under {turn:#?}: {names:?}");
        }
    }
    let agent1 = children(&spans, turn1)
        .into_iter()
        .find(|s| s.name == "agent")
        .unwrap();
    let process = children(&spans, agent1)
        .into_iter()
        .find(|s| s.name == "agent process")
        .unwrap_or_else(|| panic!("no agent process under {agent1:#?}"));
    assert_eq!(attribute(process, "exit_code").as_deref(), Some("0"));
    assert!(attribute(process, "pid").is_some(), "{process:#?}");
    let harvest1 = children(&spans, turn1)
        .into_iter()
        .find(|s| s.name == "harvest")
        .unwrap();
    assert!(
        children(&spans, harvest1)
            .iter()
            .any(|s| s.name == "git push"),
        "a push under the harvest: {:#?}",
        children(&spans, harvest1)
    );
    assert!(spans.iter().any(|s| s.name == "clone"), "a clone span");

    // The agent got its agent span's context, not the sandbox's.
    let contexts = sb.read_out("trace-context");
    let line1 = contexts.lines().find(|l| l.starts_with("run-1 ")).unwrap();
    let parts: Vec<&str> = line1.split(' ').collect();
    assert_eq!(
        parts[1],
        format!("00-{}-{}-01", hex(&agent1.trace_id), hex(&agent1.span_id)),
        "{contexts}"
    );
    // The collector's headers are withheld from the agent.
    assert!(
        contexts.lines().all(|l| l.ends_with(" withheld")),
        "{contexts}"
    );

    // Every coordinator request carried the context of an exported
    // attempt span, in the trace of its turn or the boot.
    let ids: BTreeMap<String, &Span> = spans
        .iter()
        .map(|s| (format!("00-{}-{}-01", hex(&s.trace_id), hex(&s.span_id)), s))
        .collect();
    let requests = sb.coordinator.requests();
    let api: Vec<_> = requests
        .iter()
        .filter(|r| r.path.starts_with("/api/"))
        .collect();
    assert!(api.len() > 10, "{api:#?}");
    for request in &api {
        let parent = request
            .headers
            .get("traceparent")
            .unwrap_or_else(|| panic!("no traceparent on {} {}", request.method, request.path));
        let span = ids
            .get(parent)
            .unwrap_or_else(|| panic!("{parent} on {} is no exported span", request.path));
        assert!(span.name.contains("attempt"), "{span:#?}");
    }

    // The collector's headers were sent to the collector.
    let received_all = received.lock().unwrap().clone();
    assert!(received_all.iter().all(|(_, headers, _)| {
        headers.get("authorization").and_then(|v| v.to_str().ok())
            == Some(&format!("Bearer {COLLECTOR_SECRET}") as &str)
    }));
    // Metrics.
    let names = metric_names(&received);
    for metric in [
        "hosted_boot.turn.duration",
        "hosted_boot.coordinator.requests",
        "hosted_boot.events",
        "process.memory.usage",
        "hosted_boot.redactions",
    ] {
        assert!(names.iter().any(|n| n == metric), "{metric} in {names:?}");
    }
    // No secret in anything received: the bodies, raw and decoded.
    let secrets = sb.secrets(&[CONNECTOR_SECRET, COLLECTOR_SECRET]);
    for (path, _, body) in &received_all {
        assert_no_secret(path, &String::from_utf8_lossy(body), &secrets);
    }
    assert_no_secret("spans", &format!("{spans:?}"), &secrets);
}

#[tokio::test]
async fn a_collector_that_never_answers_changes_nothing() {
    let (endpoint, received) = receiver(false).await;
    let sb = Sandbox::with_connectors(&[("SECRET_CONNECTOR", CONNECTOR_SECRET)]).await;
    let runner = runner(&sb, &endpoint);
    let snap = sb.wait_sealed("run-1").await;
    assert_eq!(
        snap.run("run-1")
            .unwrap()
            .finish
            .as_ref()
            .unwrap()
            .status
            .as_str(),
        "succeeded"
    );
    // Exports were attempted, and hang.
    for _ in 0..100 {
        if !received.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        !received.lock().unwrap().is_empty(),
        "no export was attempted"
    );
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
}
