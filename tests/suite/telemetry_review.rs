//! Review of issue 40 items 1-2 (telemetry): probes that fail where the
//! implementation breaks. Each test names what it probes; a failing test
//! is a finding (see the review report).

use hosted_boot_coordinator::{Fault, Route};
use serde_json::json;

use super::support::{Runner, Sandbox};
use super::telemetry::receiver;

const CONNECTOR_SECRET: &str = "review-connector-secret-77c2";

/// The agent: records its trace context and OTEL endpoint, says done.
const AGENT: &str = r#"
echo "$ORIZU_RUN_ID ${TRACEPARENT:-none} ${TRACESTATE:-none}" >> "$AGENT_OUT/trace-context"
echo "{\"type\":\"message\",\"text\":\"done endpoint=${OTEL_EXPORTER_OTLP_ENDPOINT:-unset}\"}"
"#;

fn runner_with(sb: &Sandbox, vars: &[(&str, &str)]) -> Runner {
    let mut cmd = sb.runner(&sb.script(AGENT));
    for (k, v) in vars {
        cmd.env(k, v);
    }
    Runner::reading(cmd.spawn().unwrap())
}

fn status_of(snap: &hosted_boot_coordinator::Snapshot, run: &str) -> String {
    snap.run(run)
        .unwrap()
        .finish
        .as_ref()
        .map(|f| format!("{} {:?}", f.status.as_str(), f))
        .unwrap_or_default()
}

/// A coordinator's `pendingTurn.tracestate` holding a NUL byte (a valid
/// W3C list member for the SDK: only `,` and `=` are refused in a value)
/// beside a valid `traceparent`: the agent's `TRACESTATE` cannot be set
/// (execve refuses a NUL), and trace context must never fail a turn
/// (wire: "trace context is never a reason to refuse a turn").
#[tokio::test]
async fn review_tracestate_with_a_nul_does_not_fail_the_turn() {
    let (endpoint, _received) = receiver(true).await;
    let sb = Sandbox::with_connectors(&[("SECRET_CONNECTOR", CONNECTOR_SECRET)]).await;
    let runner = runner_with(
        &sb,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    sb.wait_sealed("run-1").await;
    let serde_json::Value::Object(extra) = json!({"tracestate": "vendor=a\u{0}b"}) else {
        unreachable!()
    };
    sb.coordinator
        .add_fault(Fault::add_fields(Route::Session, extra).times(10_000))
        .unwrap();
    let run2 = sb.coordinator.queue_traced_turn(
        "second",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    );
    let snap = sb.wait_sealed(&run2).await;
    sb.coordinator.clear_faults();
    sb.coordinator.end_session();
    let (_status, output) = runner.finish().await;
    let status = status_of(&snap, &run2);
    assert!(
        status.starts_with("succeeded"),
        "turn with a NUL in its tracestate: {status}\n{output}"
    );
}

/// A bad endpoint URL whose userinfo holds a password: the warning must
/// not print the URL's credential.
#[tokio::test]
async fn review_a_bad_endpoint_url_never_logs_its_password() {
    let sb = Sandbox::with_connectors(&[("SECRET_CONNECTOR", CONNECTOR_SECRET)]).await;
    let runner = runner_with(
        &sb,
        &[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://otel:url-pass-9f3e@bad host:4318",
        )],
    );
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert!(output.contains("telemetry"), "a warning: {output}");
    assert!(
        !output.contains("url-pass-9f3e"),
        "the endpoint's password in the log: {output}"
    );
}

/// A valid endpoint whose userinfo holds a password: the agent gets the
/// whole URL (only the header variables are withheld) and, as it is no
/// registered secret, an agent's message with it reaches the coordinator
/// unredacted.
#[tokio::test]
async fn review_an_endpoint_password_does_not_reach_the_coordinator() {
    let (endpoint, _received) = receiver(true).await;
    let with_pass = endpoint.replace("http://", "http://otel:url-pass-41d0@");
    let sb = Sandbox::with_connectors(&[("SECRET_CONNECTOR", CONNECTOR_SECRET)]).await;
    let runner = runner_with(&sb, &[("OTEL_EXPORTER_OTLP_ENDPOINT", &with_pass)]);
    let snap = sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (_status, output) = runner.finish().await;
    let events = format!("{:?}", snap.run("run-1").unwrap());
    assert!(
        !events.contains("url-pass-41d0"),
        "the endpoint's password reached the coordinator: {events}"
    );
    assert!(!output.contains("url-pass-41d0"), "{output}");
}

// The reviewer's three timed probes (a hung collector's cost at exit;
// OTEL_BSP_SCHEDULE_DELAY=0 and OTEL_METRIC_EXPORT_INTERVAL=0 while idle)
// were run once on the fix and are not kept: timings are benchmarks' work.
// What they found is held by the unit tests of telemetry (the intervals
// raised to 100 ms, warned of) and the flush's one shared bound.

/// An unknown sampler: the runner should say so (the SDK falls back
/// silently: its internal logs are off).
#[tokio::test]
async fn review_a_bad_sampler_is_warned_of() {
    let (endpoint, _received) = receiver(true).await;
    let sb = Sandbox::with_connectors(&[("SECRET_CONNECTOR", CONNECTOR_SECRET)]).await;
    let runner = runner_with(
        &sb,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_TRACES_SAMPLER", "not_a_sampler"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "0"),
        ],
    );
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert!(
        output.contains("OTEL_TRACES_SAMPLER"),
        "no warning of the bad sampler: {output}"
    );
}

/// Telemetry off, the sandbox's TRACEPARENT set: no coordinator request
/// carries a traceparent, and the agent gets none.
#[tokio::test]
async fn review_telemetry_off_sends_no_trace_context() {
    let sb = Sandbox::with_connectors(&[("SECRET_CONNECTOR", CONNECTOR_SECRET)]).await;
    let runner = runner_with(
        &sb,
        &[
            (
                "TRACEPARENT",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            ("TRACESTATE", "vendor=x"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Bearer%20off-secret",
            ),
        ],
    );
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    for request in sb.coordinator.requests() {
        assert!(
            !request.headers.contains_key("traceparent"),
            "traceparent on {} with telemetry off",
            request.path
        );
    }
    let contexts = sb.read_out("trace-context");
    assert!(contexts.contains("run-1 none none"), "{contexts}");
}

/// Malicious pendingTurn.traceparent values (huge, non-hex, version ff,
/// a number): each turn still succeeds, with telemetry on.
#[tokio::test]
async fn review_bad_pending_traceparents_never_fail_a_turn() {
    let (endpoint, _received) = receiver(true).await;
    let sb = Sandbox::with_connectors(&[("SECRET_CONNECTOR", CONNECTOR_SECRET)]).await;
    let runner = runner_with(
        &sb,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("TRACEPARENT", "garbage\u{7f}"),
        ],
    );
    sb.wait_sealed("run-1").await;
    let huge = format!("00-{}-b7ad6b7169203331-01", "a".repeat(200_000));
    for parent in [
        huge.as_str(),
        "00-zzzz651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
    ] {
        let run = sb.coordinator.queue_traced_turn("next", parent);
        let snap = sb.wait_sealed(&run).await;
        let status = status_of(&snap, &run);
        assert!(
            status.starts_with("succeeded"),
            "{}: {status}",
            &parent[..40]
        );
    }
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
}
