//! The reliability matrix's rows of bad values from the coordinator
//! (issue 15, RELIABILITY.md): ids, the session branch and the clone URL
//! with traversal, NUL, newline, a leading `-`, `ext::`/`file://`
//! transports and user info; env bundle names that are invalid, `ORIZU_*`,
//! loader and git variables, duplicates, a NUL in a value, sizes past the
//! limits of PROTOCOL.md 2.3. Each is refused before use: the boot fails
//! with the code of 2.2 and a reason that names the field, before any clone
//! and any agent. Connector values that are merely unusual (newlines, `=`,
//! PEM blocks, JSON; 10,000 of them) are accepted and redacted.

use std::time::Duration;

use hosted_boot_coordinator::{CoordinatorOptions, Fault, Route, Target};
use serde_json::{Value, json};

use super::reliability_log::record;
use super::support::{Runner, Sandbox, WAIT, assert_events_clean};

const AGENT: &str = r#"echo '{"type":"message","text":"hello"}'"#;

/// A value refused before use: how it is served, what the reason must
/// start with and name.
struct Bad {
    row: &'static str,
    what: String,
    fault: Option<Fault>,
    connectors: Vec<(String, String)>,
    code: &'static str,
    names: String,
}

fn merged(route: Route, fields: Value) -> Option<Fault> {
    let Value::Object(fields) = fields else {
        unreachable!()
    };
    Some(Fault::merge_fields(route, fields))
}

fn session_value(what: &str, field: Value, names: &str, code: &'static str) -> Bad {
    Bad {
        row: "bad values: session",
        what: what.to_string(),
        fault: merged(Route::Session, json!({ "session": field })),
        connectors: Vec::new(),
        code,
        names: names.to_string(),
    }
}

fn repo_token_value(what: &str, fields: Value, names: &str) -> Bad {
    Bad {
        row: "bad values: clone URL",
        what: what.to_string(),
        fault: merged(Route::RepoToken, fields),
        connectors: Vec::new(),
        code: "invalid_value",
        names: names.to_string(),
    }
}

fn connector(what: &str, connectors: &[(&str, &str)], names: &str) -> Bad {
    Bad {
        row: "bad values: env bundle",
        what: what.to_string(),
        fault: None,
        connectors: connectors
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        code: "reserved_connector_env",
        names: names.to_string(),
    }
}

/// The hostile forms every textual value is tried in.
const HOSTILE: [(&str, &str); 6] = [
    ("traversal", "../../etc"),
    ("NUL", "ab\u{0}cd"),
    ("newline", "ab\ncd"),
    ("leading -", "-uupload-pack=touch"),
    ("ext:: transport", "ext::sh -c touch% /tmp/pwned"),
    ("file:// transport", "file:///etc/passwd"),
];

fn all_bad() -> Vec<Bad> {
    let mut v = Vec::new();
    for (what, value) in HOSTILE {
        v.push(session_value(
            &format!("repoBranch: {what}"),
            json!({ "repoBranch": value }),
            "repoBranch",
            "invalid_value",
        ));
        let pending = json!({"turnId": null, "ordinal": 1, "runId": value, "body": "b",
            "clientMessageId": "m", "answerToQuestion": null});
        v.push(session_value(
            &format!("pendingTurn.runId: {what}"),
            json!({ "pendingTurn": pending, "runs": [{"id": value, "status": "pending"}] }),
            "pendingTurn.runId",
            "hosted_pending_turn_invalid",
        ));
        v.push(repo_token_value(
            &format!("repoFullName: {what}"),
            json!({ "repoFullName": value }),
            "repoFullName",
        ));
        v.push(repo_token_value(
            &format!("artifactsRemote: {what}"),
            json!({ "artifactsRemote": value }),
            "artifactsRemote",
        ));
    }
    let hex = "0123456789abcdef0123456789abcdef";
    for (what, remote) in [
        (
            "user info",
            format!(
                "https://x-access-token:hunter2hunter2@{hex}.artifacts.cloudflare.net/git/a/b.git"
            ),
        ),
        (
            "http",
            format!("http://{hex}.artifacts.cloudflare.net/git/a/b.git"),
        ),
        (
            "another host",
            format!("https://{hex}.artifacts.example.net/git/a/b.git"),
        ),
        (
            "a query",
            format!("https://{hex}.artifacts.cloudflare.net/git/a/b.git?x=1"),
        ),
    ] {
        v.push(repo_token_value(
            &format!("artifactsRemote: {what}"),
            json!({ "artifactsRemote": remote }),
            "artifactsRemote",
        ));
    }
    for name in [
        "1X",
        "A-B",
        "A B",
        "",
        "A\nB",
        "ORIZU_BOOT_SECRET",
        "ORIZU_X",
        "HOSTED_BOOT_ROOT",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "GIT_CONFIG_GLOBAL",
        "GIT_SSH_COMMAND",
        "GIT_CONFIG_COUNT",
        "PATH",
        "HOME",
        "SSL_CERT_FILE",
        "BASH_ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "NODE_OPTIONS",
        "XDG_CONFIG_HOME",
        "SSH_ASKPASS",
        "GIT_ASKPASS",
        "http_proxy",
        "HTTPS_PROXY",
        "OPENSSL_CONF",
        "NODE_TLS_REJECT_UNAUTHORIZED",
    ] {
        // A name of letters, digits and `_` is named whole; another up to
        // its first other character (it may be a value pasted in).
        let named = match name.find(|c: char| !c.is_ascii_alphanumeric() && c != '_') {
            None => format!("`{name}`"),
            Some(at) => format!("`{}…` (then ", &name[..at]),
        };
        v.push(connector(
            &format!("connector name {name:?}"),
            &[(name, "connector-value-123")],
            &named,
        ));
    }
    v.push(connector(
        "a connector name twice",
        &[
            ("ACME_KEY", "first-value-123"),
            ("ACME_KEY", "second-value-456"),
        ],
        "`ACME_KEY`",
    ));
    v.push(connector(
        "a NUL in a connector value",
        &[("ACME_KEY", "before\u{0}after-nul")],
        "`ACME_KEY`",
    ));
    v
}

/// Every bad value, each on a boot of its own, four at a time: refused
/// before use with its code and a reason that names the field (never a
/// connector's value), before any clone or agent.
#[tokio::test]
async fn bad_values_from_the_coordinator_are_refused_before_use() {
    let test = "suite::bad_values::bad_values_from_the_coordinator_are_refused_before_use";
    let cases = all_bad();
    let mut failures = Vec::new();
    for chunk in cases.chunks(4) {
        let runs = chunk.iter().map(|bad| async move {
            let sb = Sandbox::start(CoordinatorOptions {
                connectors: bad.connectors.clone(),
                ..CoordinatorOptions::default()
            })
            .await;
            if let Some(f) = bad.fault.clone() {
                sb.coordinator.add_fault(f).unwrap();
            }
            let runner = Runner::spawn(&sb, &sb.script(AGENT));
            let (status, output) = runner.finish().await;
            let snap = sb.coordinator.snapshot();
            let reason = snap
                .statuses
                .iter()
                .find(|s| s.status.as_str() == "failed")
                .and_then(|s| s.reason.clone())
                .unwrap_or_default();
            let cloned = snap.requests.iter().any(|r| r.route == Target::Git);
            let spawned = !sb.read_out(".agent-pgids").is_empty();
            let orphans: u64 = sb
                .agent_groups()
                .iter()
                .map(|g| g.live_members().len() as u64)
                .sum();
            let mut secrets = sb.secrets(&[]);
            secrets.extend(
                bad.connectors
                    .iter()
                    .map(|(_, v)| v.clone())
                    .filter(|v| v.len() >= 6),
            );
            let leaked: u64 = secrets
                .iter()
                .map(|s| (output.matches(s.as_str()).count() + reason.matches(s.as_str()).count()) as u64)
                .sum();
            record(
                bad.row,
                &format!("refused before use: `{}` failed reason naming the field, no clone, no agent", bad.code),
                test,
                &[
                    ("inputs_tried", 1),
                    ("faults_injected", u64::from(bad.fault.is_some())),
                    ("secrets_checked", secrets.len() as u64),
                    ("secrets_leaked", leaked),
                    ("events_lost", 0),
                    ("orphans_left", orphans),
                ],
            );
            let ok = status.code() == Some(1)
                && reason.starts_with(&format!("{}: ", bad.code))
                && reason.contains(&bad.names)
                && !cloned
                && !spawned
                && leaked == 0
                && snap.runs.iter().all(|r| r.finish.is_none());
            (!ok).then(|| {
                format!(
                    "{}: exit {:?}, reason {reason:?} (want {}: naming {}), cloned {cloned}, spawned {spawned}, {leaked} leaks",
                    bad.what,
                    status.code(),
                    bad.code,
                    bad.names
                )
            })
        });
        failures.extend(
            futures_util::future::join_all(runs)
                .await
                .into_iter()
                .flatten(),
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Connector values with newlines, `=`, a PEM block and JSON are ordinary:
/// accepted, in the agent's environment byte for byte, and redacted from
/// every event and the log however the agent prints them (raw, as a JSON
/// string, percent-encoded).
#[tokio::test]
async fn unusual_connector_values_are_accepted_and_redacted_in_every_form() {
    let pem = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nBKcwggSjAgEAAoIBAQC7\n-----END PRIVATE KEY-----\n";
    let values = [
        ("NEWLINE_KEY", "line-one-secret\nline-two-secret"),
        ("EQUALS_KEY", "key=value==with=equals=="),
        ("PEM_KEY", pem),
        (
            "JSON_KEY",
            r#"{"client_id":"abc123","secret":"s3cr3t-json-value"}"#,
        ),
    ];
    let connectors: Vec<(&str, &str)> = values.to_vec();
    let sb = Sandbox::with_connectors(&connectors).await;
    let mut script = String::new();
    for (name, _) in values {
        script.push_str(&format!(
            "printf '%s' \"${name}\" > \"$AGENT_OUT/{name}\"\n\
             printf '%s\\n' \"${name}\"\n\
             python3 -c 'import json,os,sys; v=os.environ[sys.argv[1]]; print(json.dumps({{\"type\":\"message\",\"text\":v}})); print(json.dumps(v)); import urllib.parse; print(urllib.parse.quote(v))' {name}\n"
        ));
    }
    let runner = Runner::spawn(&sb, &sb.script(&script));
    let (snap, output) = sb.end_after_seal("run-1", runner).await;
    let run = snap.run("run-1").unwrap();
    assert_eq!(run.status, "succeeded", "{output}");
    for (name, value) in values {
        assert_eq!(
            sb.read_out(name),
            value,
            "{name} in the agent's environment"
        );
    }
    let secrets = sb.secrets(&values.map(|(_, v)| v));
    // The PEM's and the JSON's inner lines are secrets' parts, not
    // secrets: the whole value in each form is what must not appear.
    assert_events_clean(&run.events, &secrets, &run_types(&run.events));
    super::support::assert_no_secret("the runner's log", &output, &secrets);
    let forms = values.len() as u64 * 3;
    record(
        "bad values: connector values with newlines, =, PEM, JSON",
        "accepted; redacted raw, JSON-escaped and percent-encoded in events and the log",
        "suite::bad_values::unusual_connector_values_are_accepted_and_redacted_in_every_form",
        &[
            ("inputs_tried", values.len() as u64),
            ("secrets_checked", forms * secrets.len() as u64),
            ("secrets_leaked", 0),
            ("faults_injected", 0),
            ("events_lost", 0),
            ("orphans_left", 0),
        ],
    );
}

/// The runner's own event types of a run, in order (the clean check
/// compares them with themselves: this test is about the agent's).
fn run_types(events: &[hosted_boot::wire::Event]) -> Vec<&str> {
    events
        .iter()
        .filter(|e| e.kind.starts_with(super::support::RUNNER_PREFIX))
        .map(|e| e.kind.as_str())
        .collect()
}

/// 10,000 connectors within the limits of PROTOCOL.md 2.3 reach the agent,
/// with two names interpreters read only when interactive (`ENV`,
/// `PYTHONSTARTUP`), which are not reserved.
#[tokio::test]
async fn ten_thousand_connectors_are_accepted() {
    let test = "suite::bad_values::ten_thousand_connectors_are_accepted";
    let mut small: Vec<(String, String)> = (0..10_000)
        .map(|i| (format!("CONN_{i:05}"), format!("connector-value-{i:05}")))
        .collect();
    small.push(("ENV".into(), "production-environment".into()));
    small.push(("PYTHONSTARTUP".into(), "/nonexistent/startup.py".into()));
    let sb = Sandbox::start(CoordinatorOptions {
        connectors: small.clone(),
        ..CoordinatorOptions::default()
    })
    .await;
    let runner = Runner::spawn(
        &sb,
        &sb.script(
            r#"env | grep -c '^CONN_' > "$AGENT_OUT/count"
printf '%s\n' "$ENV" "$PYTHONSTARTUP" > "$AGENT_OUT/interactive"
echo done"#,
        ),
    );
    let (snap, output) = sb.end_after_seal("run-1", runner).await;
    assert_eq!(snap.run("run-1").unwrap().status, "succeeded", "{output}");
    assert_eq!(sb.read_out("count").trim(), "10000");
    assert_eq!(
        sb.read_out("interactive"),
        "production-environment\n/nonexistent/startup.py\n"
    );
    record(
        "bad values: 10,000 connectors within the size limits",
        "accepted: every one in the agent's environment",
        test,
        &[
            ("inputs_tried", small.len() as u64),
            ("faults_injected", 0),
            ("events_lost", 0),
            ("orphans_left", 0),
        ],
    );
}

/// 10,000 connectors past the 1 MiB total of PROTOCOL.md 2.3 are refused
/// at boot, before any clone or spawn.
#[tokio::test]
async fn connectors_past_the_total_size_are_refused_before_any_spawn() {
    let test = "suite::bad_values::connectors_past_the_total_size_are_refused_before_any_spawn";
    // 10,000 of 120 bytes: 1.2 MB, past the 1 MiB total.
    let big: Vec<(String, String)> = (0..10_000)
        .map(|i| {
            (
                format!("CONN_{i:05}"),
                format!("{i:05}-{}", "v".repeat(104)),
            )
        })
        .collect();
    let sb = Sandbox::start(CoordinatorOptions {
        connectors: big.clone(),
        ..CoordinatorOptions::default()
    })
    .await;
    let runner = Runner::spawn(&sb, &sb.script(AGENT));
    let (status, output) = tokio::time::timeout(WAIT + Duration::from_secs(5), runner.finish())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(1), "{output}");
    let snap = sb.coordinator.snapshot();
    let reason = snap.statuses[0].reason.clone().unwrap_or_default();
    assert!(
        reason.starts_with("reserved_connector_env: ") && reason.contains("1 MiB"),
        "{reason}"
    );
    assert!(
        sb.read_out(".agent-pgids").is_empty(),
        "an agent was spawned"
    );
    assert!(!snap.requests.iter().any(|r| r.route == Target::Git));
    record(
        "bad values: connectors past the 1 MiB total",
        "refused at boot (`reserved_connector_env`) before any clone or spawn",
        test,
        &[
            ("inputs_tried", big.len() as u64),
            ("faults_injected", 0),
            ("events_lost", 0),
            ("orphans_left", 0),
        ],
    );
}
