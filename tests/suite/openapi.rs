//! `docs/openapi.yaml` kept true: its operations are the route table's, its
//! error codes `wire::ErrorCode`'s, the runner's wire types and the
//! reference coordinator's answers validate against it; and `hosted-boot-conformance`
//! passes against the reference coordinator and names the
//! failing check for each broken variant of it (its fault knobs).

use hosted_boot::wire::routes::{Auth, Location, Route, TABLE};
use hosted_boot::wire::{
    self, AcceptedThrough, Access, BootStatus, BootStatusBody, ErrorCode, Event, EventsBody,
    FinishBody, FinishError, GitlinkReason, HarvestResult, PushError, PushErrorCode,
    RepoTokenRequest, RunOutcome, SkipReason, SkippedFile, UnpublishedGitlink, Usage,
};
use hosted_boot_conformance::openapi::Document;
use hosted_boot_coordinator::{CoordinatorOptions, Fault};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::support::{Sandbox, assert_no_secret, conformance_bin, finish, pull_bearer};

fn doc() -> Document {
    Document::load().unwrap()
}

#[test]
fn openapi_operations_are_the_route_table() {
    let doc = doc();
    let ops = doc.operations();
    assert_eq!(ops.len(), TABLE.len(), "one operation per route");
    let default_security = doc.root()["security"].clone();
    for spec in TABLE {
        let op = doc
            .operation(spec.route)
            .unwrap_or_else(|| panic!("no operation for {}", spec.name));
        assert_eq!(op.path, format!("/{}", spec.path), "{}", spec.name);
        assert_eq!(
            op.method,
            spec.method.as_str().to_lowercase(),
            "{}",
            spec.name
        );
        assert_eq!(
            op.op["x-hosted-boot-section"], spec.section,
            "{}",
            spec.name
        );
        assert_eq!(
            op.op["x-hosted-boot-body-cap"],
            json!(spec.cap),
            "{}",
            spec.name
        );
        let security = op
            .op
            .get("security")
            .cloned()
            .unwrap_or(default_security.clone());
        let scheme = match spec.auth {
            Auth::BootSecret => "bootSecret",
            Auth::Bearer => "agentBearer",
        };
        assert_eq!(security, json!([{scheme: []}]), "{}", spec.name);
        match spec.location {
            Location::ApiBase => assert!(op.op.get("x-hosted-boot-location").is_none()),
            injected => assert_eq!(op.op["x-hosted-boot-location"], injected.env_var()),
        }
        // A GET sends no body, a POST one.
        assert_eq!(
            op.op.get("requestBody").is_some(),
            spec.request != "NoBody",
            "{}",
            spec.name
        );
        // Every route documents its success and the retryable answers.
        let responses = &op.op["responses"];
        assert!(
            responses.get("200").is_some() || responses.get("2XX").is_some(),
            "{}",
            spec.name
        );
        for code in ["401", "429", "503", "default"] {
            assert!(responses.get(code).is_some(), "{} {code}", spec.name);
        }
    }
    // The compat markers of PROTOCOL.md section 2.
    let compat: Vec<&str> = TABLE
        .iter()
        .filter(|s| doc.operation(s.route).unwrap().op.get("x-compat") == Some(&json!(true)))
        .map(|s| s.name)
        .collect();
    assert_eq!(
        compat,
        ["agent-token", "boot-status", "session", "run-started"]
    );
}

#[test]
fn openapi_error_codes_are_wire_error_code() {
    let doc = doc();
    let listed: Vec<String> = doc.schema("ErrorCode").unwrap()["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let wire: Vec<String> = ErrorCode::ALL
        .iter()
        .map(|c| c.as_str().to_string())
        .collect();
    assert_eq!(listed, wire);
}

/// Every example of the document fits the schema it illustrates.
#[test]
fn openapi_examples_fit_their_schemas() {
    let doc = doc();
    let mut seen = 0;
    for op in doc.operations() {
        let mut media = Vec::new();
        if let Some(body) = op.op.get("requestBody") {
            media.push(doc.resolve(body).clone());
        }
        for response in op.op["responses"].as_object().unwrap().values() {
            media.push(doc.resolve(response).clone());
        }
        for m in media {
            let Some(json) = m.pointer("/content/application~1json") else {
                continue;
            };
            for (name, example) in json
                .get("examples")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                doc.validate(&json["schema"], &example["value"])
                    .unwrap_or_else(|e| panic!("{} example {name}: {e}", op.path));
                seen += 1;
            }
        }
    }
    assert!(seen >= 15, "{seen} examples");
}

/// The runner's wire types, serialized, are what the document describes
/// (requests), and the coordinator's types too (answers).
#[test]
fn openapi_validates_the_runners_wire_types() {
    let doc = doc();
    let request = |route: Route, value: Value| {
        let schema = doc.request_schema(route).unwrap();
        doc.validate(schema, &value)
            .unwrap_or_else(|e| panic!("{} {value}: {e}", route.name()));
    };
    for status in [
        BootStatus::Ready,
        BootStatus::TurnStarted,
        BootStatus::TurnCompleted,
        BootStatus::TurnFailed,
        BootStatus::Complete,
        BootStatus::Failed,
    ] {
        let body = BootStatusBody {
            status,
            run_id: (status != BootStatus::Ready).then(|| Some("run-1".to_string())),
            reason: (status == BootStatus::Failed)
                .then(|| ErrorCode::CloneFailed.reason("the clone failed")),
        };
        request(Route::BootStatus, serde_json::to_value(body).unwrap());
    }
    for access in [Access::Read, Access::Write] {
        request(
            Route::RepoToken,
            serde_json::to_value(RepoTokenRequest { access }).unwrap(),
        );
    }
    request(
        Route::RunStarted,
        serde_json::to_value(wire::routes::EmptyObject {}).unwrap(),
    );
    let events = EventsBody {
        events: (1..=3)
            .map(|seq| Event {
                seq,
                kind: "output".into(),
                at: "2024-01-01T00:00:00Z".into(),
                data: json!({"text": seq}),
            })
            .collect(),
    };
    request(Route::Events, serde_json::to_value(events).unwrap());
    for code in ErrorCode::ALL {
        let body = FinishBody {
            status: RunOutcome::Failed,
            agent_session_id: None,
            error: Some(FinishError {
                code: *code,
                message: "m".into(),
                retryable: code.retryable(),
                retry_after_ms: Some(1000),
                resets_at: Some("2024-01-01T00:00:00Z".into()),
            }),
            usage: None,
            result: None,
            agent_session_reset: None,
            resources: None,
        };
        request(Route::Finish, serde_json::to_value(body).unwrap());
    }
    let full = FinishBody {
        status: RunOutcome::Succeeded,
        agent_session_id: Some("agent-abc".into()),
        error: None,
        usage: Some(Usage {
            model: Some("m".into()),
            input_tokens: Some(1),
            output_tokens: Some(2),
            cache_read_tokens: Some(3),
            cache_write_tokens: Some(4),
            cost_usd: Some(0.3),
        }),
        result: Some(HarvestResult {
            name: "run-1".into(),
            branch: "orizu/session-1".into(),
            head_sha: Some("a".repeat(40)),
            pushed: false,
            commits: 1,
            files_changed: 2,
            insertions: 3,
            deletions: 4,
            harvest_commit: Some("b".repeat(40)),
            recovery_branch: Some("orizu/session-1-recovered-run-1".into()),
            push_error: Some(PushError {
                code: PushErrorCode::PushRejected,
                message: "refused".into(),
            }),
            skipped_files: vec![
                SkippedFile {
                    path: "big.bin".into(),
                    bytes: 9,
                    reason: None,
                },
                SkippedFile {
                    path: "secret.env".into(),
                    bytes: 9,
                    reason: Some(SkipReason::CleanFilter),
                },
                SkippedFile {
                    path: "scaffold".into(),
                    bytes: 0,
                    reason: Some(SkipReason::NestedRepository),
                },
                SkippedFile {
                    path: "design.psd".into(),
                    bytes: 9,
                    reason: Some(SkipReason::Lfs),
                },
            ],
            oversized_ref: Some("refs/hosted-boot/oversized/run-1".into()),
            local_branch_recovery: Some("x".into()),
            discarded_ref: Some("refs/hosted-boot/discarded/run-1".into()),
            blocked_paths: vec!["config/.env".into()],
            blocked_ref: Some("refs/hosted-boot/blocked/run-1".into()),
            unpublished_gitlinks: vec![
                UnpublishedGitlink {
                    path: "vendor/lib".into(),
                    commit: "c".repeat(40),
                    reason: GitlinkReason::SubmoduleNotPushed,
                },
                UnpublishedGitlink {
                    path: "scaffold".into(),
                    commit: "d".repeat(40),
                    reason: GitlinkReason::NoGitmodulesEntry,
                },
            ],
        }),
        agent_session_reset: Some(wire::AgentSessionReset {
            requested: "agent-old".into(),
            reason: "No conversation found with session ID: agent-old".into(),
        }),
        resources: Some(wire::Resources {
            cpu_seconds: 1.25,
            peak_rss_bytes: 52_428_800,
            source: wire::ResourceSource::Rusage,
        }),
    };
    request(Route::Finish, serde_json::to_value(full).unwrap());
    request(
        Route::Finish,
        serde_json::to_value(FinishBody {
            status: RunOutcome::Interrupted,
            agent_session_id: None,
            error: None,
            usage: None,
            result: Some(HarvestResult::default()),
            agent_session_reset: None,
            resources: None,
        })
        .unwrap(),
    );
    // What the reference coordinator's types serialize to.
    let answer = |route: Route, value: Value| {
        let schema = doc.response_schema(route, 200).unwrap();
        doc.validate(schema, &value)
            .unwrap_or_else(|e| panic!("{} {value}: {e}", route.name()));
    };
    answer(
        Route::Cursor,
        serde_json::to_value(AcceptedThrough {
            accepted_through: 7,
        })
        .unwrap(),
    );
    answer(
        Route::Finish,
        serde_json::to_value(wire::routes::Ack::OK).unwrap(),
    );
    // And the document refuses what the runner refuses.
    let schema = doc.request_schema(Route::Finish).unwrap();
    let mut bad = serde_json::to_value(FinishBody {
        status: RunOutcome::Succeeded,
        agent_session_id: None,
        error: None,
        usage: None,
        result: None,
        agent_session_reset: None,
        resources: None,
    })
    .unwrap();
    bad["error"] = json!({"code": "not_a_code", "message": "m", "retryable": false});
    assert!(doc.validate(schema, &bad).is_err());
}

fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// Every route of the reference coordinator, called with its real
/// credential, answers what the document says.
#[tokio::test]
async fn openapi_validates_the_reference_coordinators_answers() {
    let sb = Sandbox::start(CoordinatorOptions {
        connectors: vec![("API_KEY".into(), "v".into())],
        redact_vars: vec!["OTHER".into()],
        ..CoordinatorOptions::default()
    })
    .await;
    let c = &sb.coordinator;
    let doc = doc();
    let http = client();
    let secret = c.boot_secret();
    let bearer = pull_bearer(&http, c).await;
    let event = json!({"seq": 1, "type": "output", "at": "2024-01-01T00:00:00Z", "data": {}});
    let finish = json!({"status": "succeeded", "agentSessionId": null, "error": null, "usage": null, "result": null});
    let calls: Vec<(Route, Option<Value>)> = vec![
        (Route::AgentToken, None),
        (
            Route::BootStatus,
            Some(json!({"status": "turn_started", "runId": "run-1"})),
        ),
        (Route::EnvBundle, None),
        (Route::Session, None),
        (Route::RepoToken, Some(json!({"access": "read"}))),
        (Route::RunStarted, Some(json!({}))),
        (Route::Events, Some(json!({"events": [event]}))),
        (Route::Cursor, None),
        (Route::Finish, Some(finish)),
        (Route::AgentStateLoad, None),
        (
            Route::AgentStateSave,
            Some(
                json!({"format": 1, "cli": "claude", "agentSessionId": "a", "runId": "run-1",
                "files": [{"path": "a.jsonl", "content": "e30K"}]}),
            ),
        ),
    ];
    assert_eq!(calls.len(), TABLE.len());
    for (route, body) in calls {
        let spec = route.spec();
        let url = match spec.location {
            Location::AgentTokenUrl => c.agent_token_url(),
            Location::BootStatusUrl => c.boot_status_url(),
            Location::ApiBase => format!(
                "{}{}",
                c.base_url(),
                route.path(if spec.param == wire::routes::Param::RunId {
                    "run-1"
                } else {
                    "s1"
                })
            ),
        };
        let credential = match spec.auth {
            Auth::BootSecret => &secret,
            Auth::Bearer => &bearer,
        };
        let req = match body {
            Some(b) => http.post(&url).json(&b),
            None => http.get(&url),
        };
        let resp = req.bearer_auth(credential).send().await.unwrap();
        let status = resp.status().as_u16();
        assert_eq!(status, 200, "{}", spec.name);
        let value: Value = resp.json().await.unwrap();
        let schema = doc.response_schema(route, status).unwrap();
        doc.validate(schema, &value)
            .unwrap_or_else(|e| panic!("{}: {e}", spec.name));
        // A wrong credential is the documented 401.
        let req = if spec.method.as_str() == "POST" {
            http.post(&url).json(&json!({}))
        } else {
            http.get(&url)
        };
        let resp = req.bearer_auth("wrong").send().await.unwrap();
        assert_eq!(resp.status(), 401, "{}", spec.name);
        let value: Value = resp.json().await.unwrap();
        doc.validate(doc.response_schema(route, 401).unwrap(), &value)
            .unwrap();
    }
}

/// The long-poll of the session read (PROTOCOL.md 2.4) as the document
/// describes it: the headers the runner sends are the session operation's
/// parameters, and what the reference coordinator answers with the
/// extension on (`ETag`, `Preference-Applied`, a `304` to a matching
/// `If-None-Match`) are the documented responses and their headers.
#[tokio::test]
async fn openapi_documents_the_long_poll_of_the_session_read() {
    use hosted_boot::client::long_poll::{PREFER, PREFERENCE_APPLIED};
    let sb = Sandbox::start(CoordinatorOptions {
        long_poll: true,
        ..CoordinatorOptions::default()
    })
    .await;
    let c = &sb.coordinator;
    let doc = doc();
    let op = doc.operation(Route::Session).unwrap();
    let params: Vec<String> = op.op["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| doc.resolve(p))
        .filter(|p| p["in"] == "header")
        .map(|p| p["name"].as_str().unwrap().to_lowercase())
        .collect();
    for name in [PREFER, "if-none-match"] {
        assert!(params.iter().any(|p| p == name), "{name} in {params:?}");
    }
    let documented = |status: &str| -> Vec<String> {
        let resp = doc.resolve(&op.op["responses"][status]);
        resp["headers"]
            .as_object()
            .unwrap_or_else(|| panic!("no headers on {status}"))
            .keys()
            .map(|k| k.to_lowercase())
            .collect()
    };
    let http = client();
    let bearer = pull_bearer(&http, c).await;
    let url = format!("{}{}", c.base_url(), Route::Session.path("s1"));
    // A first read with the preference: answered at once (nothing to match).
    let first = http
        .get(&url)
        .bearer_auth(&bearer)
        .header(PREFER, "wait=1")
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    for name in ["etag", PREFERENCE_APPLIED] {
        assert!(first.headers().contains_key(name), "200 lacks {name}");
        assert!(documented("200").iter().any(|d| d == name), "200 {name}");
    }
    let etag = first.headers()["etag"].to_str().unwrap().to_string();
    let value: Value = first.json().await.unwrap();
    doc.validate(doc.response_schema(Route::Session, 200).unwrap(), &value)
        .unwrap();
    // The documented shapes of what the runner sends back.
    let param = |name: &str| {
        op.op["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| doc.resolve(p))
            .find(|p| p["name"].as_str().unwrap().eq_ignore_ascii_case(name))
            .unwrap()["schema"]
            .clone()
    };
    doc.validate(&param("If-None-Match"), &json!(etag)).unwrap();
    doc.validate(&param("Prefer"), &json!("wait=30")).unwrap();
    // A conditional read of the unchanged session without a wait: `304` at
    // once, documented with its headers.
    let again = http
        .get(&url)
        .bearer_auth(&bearer)
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 304);
    assert_eq!(again.headers()["etag"].to_str().unwrap(), etag);
    assert!(documented("304").iter().any(|d| d == "etag"));
    assert!(documented("304").iter().any(|d| d == PREFERENCE_APPLIED));
    assert!(again.bytes().await.unwrap().is_empty());
}

/// `hosted-boot-conformance` against the sandbox's coordinator, with the
/// faults `faults` queued first: its exit code and output.
async fn conformance(sb: &Sandbox) -> (i32, String) {
    let cmd = sb
        .program_command(&[], &conformance_bin(), &sb.script("true"))
        .spawn()
        .unwrap();
    let (status, out) = finish(cmd).await;
    assert_no_secret("conformance output", &out, &sb.secrets(&[]));
    (status.code().unwrap_or(-1), out)
}

/// The table's row for the check whose name starts with `check`: (result,
/// the rest of the line).
fn row<'a>(out: &'a str, check: &str) -> (&'a str, &'a str) {
    let line = out
        .lines()
        .find(|l| l.starts_with(check))
        .unwrap_or_else(|| panic!("no row {check:?}:\n{out}"));
    for result in ["  PASS  ", "  FAIL  "] {
        if let Some((_, rest)) = line.split_once(result) {
            return (result.trim(), rest);
        }
    }
    panic!("row {check:?} has no result: {line}")
}

#[tokio::test]
async fn conformance_passes_against_the_reference_coordinator() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let (code, out) = conformance(&sb).await;
    assert_eq!(code, 0, "{out}");
    // It says what it will change before anything else.
    let preface = out.find("This runs one real turn").expect("no preface");
    assert!(preface < out.find("check ").unwrap(), "{out}");
    assert!(out.contains("no complete or failed is posted"), "{out}");
    assert!(!out.contains("FAIL"), "{out}");
    for check in [
        "POST events: answers match docs/openapi.yaml",
        "events: a large batch",
        "events: a small batch",
        "events: a resend at or below the cursor is ignored",
        "credential helper: a write repo token",
        "seal: finish succeeded accepted",
        "graceful stop",
    ] {
        assert_eq!(row(&out, check).0, "PASS", "{check}: {out}");
    }
    // One turn, sealed and acknowledged; the session is left waiting for the
    // next (no complete, no failed: a graceful stop posts nothing, 4.4).
    let snap = sb.coordinator.snapshot();
    let run = sb.coordinator.run("run-1").unwrap();
    assert_eq!(run.status, "succeeded", "{out}");
    assert_eq!(run.finish_count, 1);
    let statuses: Vec<&str> = sb
        .coordinator
        .statuses()
        .iter()
        .map(|s| s.status.as_str())
        .collect();
    assert_eq!(statuses, ["turn_started", "turn_completed"]);
    // The resend was ignored: events are numbered from 1 without a repeat.
    let seqs: Vec<u64> = run.events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    assert!(seqs.len() > hosted_boot_conformance::LARGE_BURST);
    drop(snap);
}

/// Issue 45: against a coordinator that answers the event posts slowly,
/// the agent's last line went out with the rest of its burst and no small
/// batch was ever sent: "events: a small batch" failed a coordinator that
/// conforms. The agent now waits until the proxy saw its burst accepted
/// whole, so its last line goes in a batch of its own whatever the pace.
#[tokio::test]
async fn conformance_sends_its_small_batch_against_a_slow_coordinator() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    sb.coordinator
        .add_fault(Fault::delay(Route::Events, std::time::Duration::from_millis(1500)).times(3))
        .unwrap();
    // The contract's own durations: the events' flush deadline at the
    // test's scale would give up on answers this slow.
    let mut cmd = sb.program_command(&[], &conformance_bin(), &sb.script("true"));
    cmd.env("HOSTED_BOOT_TEST_TIME_SCALE", "1");
    let (status, out) = finish(cmd.spawn().unwrap()).await;
    assert_no_secret("conformance output", &out, &sb.secrets(&[]));
    let code = status.code().unwrap_or(-1);
    assert_eq!(row(&out, "events: a small batch").0, "PASS", "{out}");
    assert_eq!(code, 0, "{out}");
}

/// Ctrl-C or SIGTERM during conformance's turn stops the runner as a
/// sandbox's stop does, through the proxy, which still serves it: the run
/// is sealed, not left running; nothing of conformance is left running or
/// in its temporary directory; no table, exit 2, the signal named. (It used
/// to exit by the signal's default action: the runner went on alone against
/// a proxy that was gone, and the run stayed running.)
#[tokio::test]
async fn conformance_stopped_by_a_signal_stops_its_runner_and_leaves_nothing() {
    // A coordinator one round trip away: the turn lasts long enough to be
    // stopped in.
    let sb = Sandbox::start(CoordinatorOptions {
        latency: std::time::Duration::from_millis(150),
        ..CoordinatorOptions::default()
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let child = sb
        .program_command(&[], &conformance_bin(), &sb.script("true"))
        .env("TMPDIR", tmp.path())
        .spawn()
        .unwrap();
    // Stopped mid-turn: once the runner marked the run started.
    sb.coordinator
        .wait_for(std::time::Duration::from_secs(60), |s| {
            s.run("run-1").is_some_and(|r| r.status == "running")
        })
        .await
        .expect("run-1 never started");
    super::support::signal(child.id().unwrap(), rustix::process::Signal::TERM);
    let (status, out) = finish(child).await;
    assert_eq!(status.code(), Some(2), "{out}");
    assert!(
        out.contains("stopped by SIGTERM before the checks were done"),
        "{out}"
    );
    assert!(!out.contains("check "), "no table: {out}");
    let run = sb.coordinator.run("run-1").unwrap();
    assert_ne!(run.status, "running", "the run was left running: {out}");
    assert_eq!(run.finish_count, 1, "{out}");
    super::support::assert_nothing_left(tmp.path(), "conformance");
}

async fn broken(fault: Fault) -> String {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    sb.coordinator.add_fault(fault).unwrap();
    let (code, out) = conformance(&sb).await;
    assert_eq!(code, 1, "{out}");
    out
}

#[tokio::test]
async fn conformance_names_a_missing_field() {
    let out = broken(Fault::body(
        Route::Session,
        r#"{"session": {"repoBranch": "orizu/session-1", "status": "active", "clientInfo": {"task": "t"}, "runs": [{"id": "run-1", "status": "pending"}]}}"#,
    ))
    .await;
    let (result, detail) = row(&out, "GET session: answers match docs/openapi.yaml");
    assert_eq!(result, "FAIL", "{out}");
    assert!(
        detail.contains("/session/workspaceId: missing, required"),
        "{out}"
    );
}

#[tokio::test]
async fn conformance_names_a_wrong_status_code() {
    let out = broken(Fault::status(Route::RunStarted, 404)).await;
    let (result, detail) = row(&out, "POST run-started: answers 2xx");
    assert_eq!(result, "FAIL", "{out}");
    assert!(detail.contains("expected 2xx, got 404"), "{out}");
}

#[tokio::test]
async fn conformance_names_a_cursor_that_goes_backwards() {
    let out = broken(Fault::body(Route::Cursor, r#"{"acceptedThrough": 0}"#)).await;
    let (result, detail) = row(&out, "events: acceptedThrough never goes backwards");
    assert_eq!(result, "FAIL", "{out}");
    assert!(detail.contains(", got 0"), "{out}");
    assert_eq!(
        row(&out, "events: the cursor is the last acceptedThrough").0,
        "FAIL"
    );
}

#[tokio::test]
async fn conformance_names_a_redirect() {
    let out = broken(Fault::redirect(
        Route::EnvBundle,
        307,
        "http://127.0.0.1:9/elsewhere",
    ))
    .await;
    let (result, detail) = row(&out, "no redirects");
    assert_eq!(result, "FAIL", "{out}");
    assert!(
        detail.contains("got 307 on env-bundle with a Location"),
        "{out}"
    );
    assert!(
        !out.contains("127.0.0.1:9"),
        "the Location is not shown: {out}"
    );
}
