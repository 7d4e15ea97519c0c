//! The reference coordinator (PROTOCOL.md section 6) driven over HTTP with a
//! real client and the git CLI. Compat bodies are checked against literal
//! JSON written from PROTOCOL.md, not through the shared wire types.

use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine as _;
use hosted_boot::wire::AnswerToQuestion;
use hosted_boot_coordinator::{Coordinator, CoordinatorOptions, DevError, Fault, Route, Target};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::support::{coordinator_bin, pull_bearer};

const WAIT: Duration = Duration::from_secs(10);

fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

async fn start(opts: CoordinatorOptions) -> Coordinator {
    Coordinator::start(opts).await.unwrap()
}

fn url(c: &Coordinator, path: &str) -> String {
    format!("{}{}", c.base_url(), path)
}

async fn get_json(http: &reqwest::Client, url: &str, bearer: &str) -> (u16, Value) {
    let resp = http.get(url).bearer_auth(bearer).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn post_json(http: &reqwest::Client, url: &str, bearer: &str, body: Value) -> (u16, Value) {
    let resp = http
        .post(url)
        .bearer_auth(bearer)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn session(c: &Coordinator, http: &reqwest::Client, bearer: &str) -> Value {
    let (status, body) = get_json(http, &url(c, "api/cli/sessions/s1"), bearer).await;
    assert_eq!(status, 200);
    body
}

fn finish_body(status: &str) -> Value {
    json!({"status": status, "agentSessionId": "agent-abc", "error": null, "usage": null, "result": null})
}

#[tokio::test]
async fn agent_token_needs_the_boot_secret() {
    let c = start(CoordinatorOptions::default()).await;
    let http = client();
    assert_eq!(c.boot_secret().len(), 64);

    let wrong = http
        .get(c.agent_token_url())
        .bearer_auth("0".repeat(64))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let none = http.get(c.agent_token_url()).send().await.unwrap();
    assert_eq!(none.status(), 401);

    let resp = http
        .get(c.agent_token_url())
        .bearer_auth(c.boot_secret())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers().contains_key("date"),
        "the lifetime is computed from Date"
    );
    let body: Value = resp.json().await.unwrap();
    let first = body["token"].as_str().unwrap().to_string();
    let expires = body["expiresAt"].as_str().unwrap();
    humantime::parse_rfc3339_weak(expires).unwrap();
    assert_eq!(body.as_object().unwrap().len(), 2, "{body}");

    // A fresh bearer per pull; every bearer stays valid until its TTL.
    let second = pull_bearer(&http, &c).await;
    assert_ne!(first, second);
    session(&c, &http, &first).await;
    session(&c, &http, &second).await;
    // The boot secret is not a bearer.
    let (status, _) = get_json(&http, &url(&c, "api/cli/sessions/s1"), &c.boot_secret()).await;
    assert_eq!(status, 401);
    // An unknown session.
    let resp = http
        .get(url(&c, "api/cli/sessions/other/agent-token"))
        .bearer_auth(c.boot_secret())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);

    let secrets = c.issued_secrets();
    assert_eq!(
        secrets,
        vec![c.boot_secret(), first.clone(), second.clone()]
    );
    let record = serde_json::to_string(&c.requests()).unwrap();
    for s in &secrets {
        assert!(!record.contains(s.as_str()), "the record holds a secret");
    }
    let reqs = c.requests();
    assert_eq!(reqs[0].route, Route::AgentToken);
    assert_eq!(reqs[0].header("Authorization"), Some("Bearer ***"));
    assert_eq!(reqs[0].response_status, Some(401));
    assert_eq!(reqs[1].header("authorization"), None);
}

#[tokio::test]
async fn an_expired_bearer_is_refused() {
    let c = start(CoordinatorOptions {
        bearer_ttl: Duration::ZERO,
        ..CoordinatorOptions::default()
    })
    .await;
    let http = client();
    let b = pull_bearer(&http, &c).await;
    let (status, _) = get_json(&http, &url(&c, "api/cli/sessions/s1"), &b).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn session_and_env_bundle_match_the_contract() {
    let c = start(CoordinatorOptions {
        task: "Fix the flaky test".into(),
        model: Some("model-x".into()),
        reasoning_effort: Some("high".into()),
        duration_minutes: Some(30.0),
        connectors: vec![("API_KEY".into(), "connector-secret-value".into())],
        redact_vars: vec!["OTHER_SECRET".into()],
        ..CoordinatorOptions::default()
    })
    .await;
    let http = client();
    let b = pull_bearer(&http, &c).await;
    assert_eq!(
        session(&c, &http, &b).await,
        json!({"session": {
            "workspaceId": "ws-1",
            "repoBranch": "orizu/session-1",
            "status": "active",
            "clientInfo": {"task": "Fix the flaky test", "model": "model-x",
                           "reasoningEffort": "high", "durationMinutes": 30.0},
            "runs": [{"id": "run-1", "status": "pending"}],
            "pendingTurn": null,
            "interruptRequestedRunId": null,
            "agentSessionId": null,
            "projectId": null,
            "agentState": {"maxBytes": 8 * 1024 * 1024},
            "acceptsReleased": true
        }})
    );
    let (status, bundle) = get_json(&http, &url(&c, "api/cli/sessions/s1/env-bundle"), &b).await;
    assert_eq!(status, 200);
    assert_eq!(
        bundle,
        json!({"connectors": [{"envVar": "API_KEY", "value": "connector-secret-value"}],
               "redactVars": ["OTHER_SECRET"]})
    );
    let (status, _) = get_json(&http, &url(&c, "api/cli/sessions/other"), &b).await;
    assert_eq!(status, 404);
    let resp = http
        .get(url(&c, "api/cli/sessions/s1"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let resp = http
        .post(url(&c, "api/cli/sessions/s1"))
        .bearer_auth(&b)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
}

#[tokio::test]
async fn turns_move_pending_turn_along() {
    let c = start(CoordinatorOptions::default()).await;
    let http = client();
    let b = pull_bearer(&http, &c).await;

    // Queued over the dev API while run-1 (the initial task) is unfinished:
    // pendingTurn stays null until run-1 is sealed.
    let (status, queued) = post_json(
        &http,
        &url(&c, "dev/turns"),
        "",
        json!({"body": "Second turn"}),
    )
    .await;
    assert_eq!((status, queued), (200, json!({"runId": "run-2"})));
    let s = session(&c, &http, &b).await;
    assert_eq!(s["session"]["pendingTurn"], Value::Null);
    assert_eq!(
        s["session"]["runs"],
        json!([{"id": "run-2", "status": "pending"}, {"id": "run-1", "status": "pending"}])
    );

    let (status, _) = post_json(
        &http,
        &url(&c, "api/cli/workbench-runs/run-1"),
        &b,
        json!({}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(c.run("run-1").unwrap().status, "running");
    // Idempotent.
    let (status, _) = post_json(
        &http,
        &url(&c, "api/cli/workbench-runs/run-1"),
        &b,
        json!({}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = post_json(
        &http,
        &url(&c, "api/cli/workbench-runs/run-1/finish"),
        &b,
        finish_body("succeeded"),
    )
    .await;
    assert_eq!(status, 200);

    let s = session(&c, &http, &b).await;
    assert_eq!(
        s["session"]["pendingTurn"],
        json!({"turnId": "turn-2", "ordinal": 2, "runId": "run-2", "body": "Second turn",
               "clientMessageId": "msg-2", "answerToQuestion": null})
    );
    assert_eq!(s["session"]["agentSessionId"], "agent-abc");

    let run3 = c.queue_turn(
        "Use the blue one",
        Some(AnswerToQuestion {
            question_id: "q-1".into(),
            question: "Which colour?".into(),
        }),
    );
    assert_eq!(run3, "run-3");

    // Interrupt: by default the running run.
    assert!(matches!(c.interrupt(None), Err(DevError::NoRunningRun)));
    post_json(
        &http,
        &url(&c, "api/cli/workbench-runs/run-2"),
        &b,
        json!({}),
    )
    .await;
    let (status, body) = post_json(&http, &url(&c, "dev/interrupt"), "", json!({})).await;
    assert_eq!((status, body), (200, json!({"runId": "run-2"})));
    let s = session(&c, &http, &b).await;
    assert_eq!(s["session"]["interruptRequestedRunId"], "run-2");

    let (status, _) = post_json(
        &http,
        &url(&c, "api/cli/workbench-runs/run-2/finish"),
        &b,
        finish_body("interrupted"),
    )
    .await;
    assert_eq!(status, 200);
    // Same status again: idempotent; another status: 409.
    let (status, _) = post_json(
        &http,
        &url(&c, "api/cli/workbench-runs/run-2/finish"),
        &b,
        finish_body("interrupted"),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = post_json(
        &http,
        &url(&c, "api/cli/workbench-runs/run-2/finish"),
        &b,
        finish_body("succeeded"),
    )
    .await;
    assert_eq!(status, 409);
    assert_eq!(c.run("run-2").unwrap().finish_count, 2);

    let s = session(&c, &http, &b).await;
    assert_eq!(s["session"]["interruptRequestedRunId"], Value::Null);
    assert_eq!(
        s["session"]["pendingTurn"],
        json!({"turnId": "turn-3", "ordinal": 3, "runId": "run-3", "body": "Use the blue one",
               "clientMessageId": "msg-3",
               "answerToQuestion": {"questionId": "q-1", "question": "Which colour?"}})
    );
    assert_eq!(
        s["session"]["runs"],
        json!([{"id": "run-3", "status": "pending"}, {"id": "run-2", "status": "interrupted"},
               {"id": "run-1", "status": "succeeded"}])
    );

    // Unknown run, malformed finish.
    let (status, _) = post_json(
        &http,
        &url(&c, "api/cli/workbench-runs/run-9/finish"),
        &b,
        finish_body("succeeded"),
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = post_json(
        &http,
        &url(&c, "api/cli/workbench-runs/run-3/finish"),
        &b,
        json!({"status": "done"}),
    )
    .await;
    assert_eq!(status, 400);

    let (status, _) = post_json(&http, &url(&c, "dev/end"), "", json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(session(&c, &http, &b).await["session"]["status"], "ended");
}

#[tokio::test]
async fn an_idle_start_has_no_run_until_a_turn_is_queued() {
    let c = start(CoordinatorOptions {
        start_idle: true,
        ..CoordinatorOptions::default()
    })
    .await;
    let http = client();
    let b = pull_bearer(&http, &c).await;
    let s = session(&c, &http, &b).await;
    assert_eq!(s["session"]["runs"], json!([]));
    assert_eq!(s["session"]["pendingTurn"], Value::Null);
    assert_eq!(c.queue_turn("First", None), "run-1");
    let s = session(&c, &http, &b).await;
    assert_eq!(s["session"]["pendingTurn"]["runId"], "run-1");
    assert_eq!(s["session"]["pendingTurn"]["ordinal"], 1);
}

/// `counts_only` (bench/memory): events keep seq, type and time, not data;
/// requests their length, not their body; the cursor works as ever.
#[tokio::test]
async fn counts_only_keeps_each_events_seq_and_type_but_no_body() {
    let c = start(CoordinatorOptions {
        counts_only: true,
        ..CoordinatorOptions::default()
    })
    .await;
    let http = client();
    let b = pull_bearer(&http, &c).await;
    let body = "x".repeat(100_000);
    let ev = |seq: u64| json!({"seq": seq, "type": "output", "at": "2024-01-01T00:00:00Z", "data": {"text": body}});
    let events_url = url(&c, "api/cli/workbench-runs/run-1/events");
    let r = post_json(&http, &events_url, &b, json!({"events": [ev(1), ev(2)]})).await;
    assert_eq!(r, (200, json!({"acceptedThrough": 2})));
    let run = c.run("run-1").unwrap();
    let kept: Vec<(u64, &str, &Value)> = run
        .events
        .iter()
        .map(|e| (e.seq, e.kind.as_str(), &e.data))
        .collect();
    assert_eq!(
        kept,
        vec![(1, "output", &Value::Null), (2, "output", &Value::Null)]
    );
    let snap = c.snapshot();
    let posted = snap
        .requests
        .iter()
        .find(|r| r.route == Route::Events)
        .unwrap();
    assert_eq!(posted.body, Value::Null);
    assert!(posted.body_len > 200_000, "{}", posted.body_len);
}

#[tokio::test]
async fn events_are_accepted_in_order_and_the_cursor_follows() {
    let c = start(CoordinatorOptions::default()).await;
    let http = client();
    let b = pull_bearer(&http, &c).await;
    let ev = |seq: u64| json!({"seq": seq, "type": "output", "at": "2024-01-01T00:00:00Z", "data": {"text": seq}});
    let events_url = url(&c, "api/cli/workbench-runs/run-1/events");
    let cursor_url = url(&c, "api/cli/workbench-runs/run-1/events/cursor");

    assert_eq!(
        get_json(&http, &cursor_url, &b).await,
        (200, json!({"acceptedThrough": 0}))
    );
    let r = post_json(&http, &events_url, &b, json!({"events": [ev(1), ev(2)]})).await;
    assert_eq!(r, (200, json!({"acceptedThrough": 2})));
    // A resend is harmless.
    let r = post_json(&http, &events_url, &b, json!({"events": [ev(2), ev(3)]})).await;
    assert_eq!(r, (200, json!({"acceptedThrough": 3})));
    // A gap is refused whole.
    let (status, _) = post_json(&http, &events_url, &b, json!({"events": [ev(4), ev(6)]})).await;
    assert_eq!(status, 409);
    assert_eq!(
        get_json(&http, &cursor_url, &b).await,
        (200, json!({"acceptedThrough": 3}))
    );
    let seqs: Vec<u64> = c
        .run("run-1")
        .unwrap()
        .events
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, vec![1, 2, 3]);
    let (status, _) = get_json(
        &http,
        &url(&c, "api/cli/workbench-runs/nope/events/cursor"),
        &b,
    )
    .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn boot_statuses_and_requests_are_recorded_in_order() {
    let c = start(CoordinatorOptions::default()).await;
    let http = client();
    let status_url = c.boot_status_url();
    for body in [
        json!({"status": "ready"}),
        json!({"status": "turn_started", "runId": "run-1"}),
        json!({"status": "failed", "runId": null, "reason": "boom"}),
    ] {
        let resp = http
            .post(&status_url)
            .bearer_auth(c.boot_secret())
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    let b = pull_bearer(&http, &c).await;
    // A bearer is not the boot secret.
    let resp = http
        .post(&status_url)
        .bearer_auth(&b)
        .json(&json!({"status": "ready"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let resp = http
        .get(url(&c, "api/cli/sessions/s1"))
        .bearer_auth(&b)
        .header("x-orizu-hosted-poll", "during-turn")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    let statuses: Vec<Value> = c
        .statuses()
        .iter()
        .map(|s| serde_json::to_value(s).unwrap())
        .collect();
    assert_eq!(
        statuses,
        vec![
            json!({"status": "ready"}),
            json!({"status": "turn_started", "runId": "run-1"}),
            json!({"status": "failed", "runId": null, "reason": "boom"}),
        ]
    );
    let reqs = c.requests();
    let routes: Vec<&str> = reqs.iter().map(|r| r.route.name()).collect();
    assert_eq!(
        routes,
        vec![
            "boot-status",
            "boot-status",
            "boot-status",
            "agent-token",
            "boot-status",
            "session"
        ]
    );
    assert_eq!(reqs[1].method, "POST");
    assert_eq!(reqs[1].path, "/api/cli/sessions/s1/boot-status");
    assert_eq!(
        reqs[1].body,
        json!({"status": "turn_started", "runId": "run-1"})
    );
    assert_eq!(reqs[4].response_status, Some(401));
    assert_eq!(reqs[5].header("x-orizu-hosted-poll"), Some("during-turn"));

    // The same record over the dev API.
    let (status, body) = get_json(&http, &url(&c, "dev/requests"), "").await;
    assert_eq!(status, 200);
    assert_eq!(body[1]["route"], "boot-status");
    assert_eq!(body[1]["headers"]["authorization"], "Bearer ***");
    assert_eq!(
        body[1]["body"],
        json!({"status": "turn_started", "runId": "run-1"})
    );
    let (status, state) = get_json(&http, &url(&c, "dev/state"), "").await;
    assert_eq!(status, 200);
    assert_eq!(state["statuses"][0], json!({"status": "ready"}));
    assert_eq!(state["runs"][0]["id"], "run-1");
    assert_eq!(state["session"]["repoBranch"], "orizu/session-1");
}

#[tokio::test]
async fn a_503_fault_answers_count_times_then_the_normal_answer() {
    let c = start(CoordinatorOptions::default()).await;
    let http = client();
    let b = pull_bearer(&http, &c).await;
    c.add_fault(
        Fault::status(Route::Session, 503)
            .times(2)
            .with_retry_after("1"),
    )
    .unwrap();
    let session_url = url(&c, "api/cli/sessions/s1");
    for _ in 0..2 {
        let resp = http.get(&session_url).bearer_auth(&b).send().await.unwrap();
        assert_eq!(resp.status(), 503);
        assert_eq!(resp.headers()["retry-after"], "1");
    }
    let resp = http.get(&session_url).bearer_auth(&b).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let statuses: Vec<Option<u16>> = c
        .requests()
        .iter()
        .filter(|r| r.route == Route::Session)
        .map(|r| r.response_status)
        .collect();
    assert_eq!(statuses, vec![Some(503), Some(503), Some(200)]);

    // Over the dev API, a body fault replaces the session (a malformed
    // pendingTurn), and an invalid fault is refused.
    let (status, _) = post_json(
        &http,
        &url(&c, "dev/faults"),
        "",
        json!({"route": "session", "body": "{\"session\": {\"pendingTurn\": {\"runId\": 3}}}", "count": 1}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, body) = get_json(&http, &session_url, &b).await;
    assert_eq!(
        (status, body),
        (200, json!({"session": {"pendingTurn": {"runId": 3}}}))
    );
    let (status, _) = post_json(
        &http,
        &url(&c, "dev/faults"),
        "",
        json!({"route": "dev", "status": 503}),
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = post_json(
        &http,
        &url(&c, "dev/faults"),
        "",
        json!({"route": "session", "count": 1}),
    )
    .await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn a_reset_fault_is_a_transport_error() {
    let c = start(CoordinatorOptions::default()).await;
    let http = client();
    c.add_fault(Fault::reset(Route::AgentToken)).unwrap();
    let err = http
        .get(c.agent_token_url())
        .bearer_auth(c.boot_secret())
        .send()
        .await
        .unwrap_err();
    assert!(err.status().is_none(), "no HTTP status: {err:?}");
    assert!(!err.is_timeout(), "{err:?}");
    // The next request is answered normally.
    pull_bearer(&http, &c).await;
    let reqs = c.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].response_status, None);
    assert!(reqs[0].fault.as_ref().unwrap().reset);
    // No token was issued for the dropped request.
    assert_eq!(c.issued_secrets().len(), 2);
}

#[tokio::test]
async fn a_delay_fault_delays_the_normal_answer() {
    let c = start(CoordinatorOptions::default()).await;
    let http = client();
    let b = pull_bearer(&http, &c).await;
    c.add_fault(Fault::delay(Route::Cursor, Duration::from_millis(300)))
        .unwrap();
    let t = Instant::now();
    let r = get_json(
        &http,
        &url(&c, "api/cli/workbench-runs/run-1/events/cursor"),
        &b,
    )
    .await;
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert_eq!(r, (200, json!({"acceptedThrough": 0})));
}

#[tokio::test]
async fn a_pad_fault_streams_the_normal_answer_then_spaces() {
    let c = start(CoordinatorOptions::default()).await;
    let http = client();
    let b = pull_bearer(&http, &c).await;
    let normal = http
        .get(url(&c, "api/cli/sessions/s1"))
        .bearer_auth(&b)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    c.add_fault(Fault::pad(Route::Session, 200_000)).unwrap();
    let r = http
        .get(url(&c, "api/cli/sessions/s1"))
        .bearer_auth(&b)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.content_length(), Some(normal.len() as u64 + 200_000));
    let body = r.bytes().await.unwrap();
    assert_eq!(&body[..normal.len()], &normal[..]);
    assert!(body[normal.len()..].iter().all(|b| *b == b' '));
    assert_eq!(body.len(), normal.len() + 200_000);
    // Still the session, as JSON.
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["session"]["repoBranch"], "orizu/session-1");
    assert!(c.add_fault(Fault::pad(Target::Git, 1)).is_err());
}

#[tokio::test]
async fn a_stall_fault_pauses_the_body_after_its_first_chunk() {
    let c = start(CoordinatorOptions::default()).await;
    let http = client();
    let b = pull_bearer(&http, &c).await;
    c.add_fault(Fault::stall(Route::Cursor, Duration::from_millis(400)))
        .unwrap();
    let t = Instant::now();
    let mut r = http
        .get(url(&c, "api/cli/workbench-runs/run-1/events/cursor"))
        .bearer_auth(&b)
        .send()
        .await
        .unwrap();
    let headers_at = t.elapsed();
    let mut body = Vec::new();
    while let Some(chunk) = r.chunk().await.unwrap() {
        body.extend_from_slice(&chunk);
    }
    assert!(headers_at < Duration::from_millis(400), "{headers_at:?}");
    assert!(t.elapsed() >= Duration::from_millis(400));
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap(),
        json!({"acceptedThrough": 0})
    );
}

#[tokio::test]
async fn an_after_fault_applies_the_request_and_loses_the_answer() {
    let c = start(CoordinatorOptions::default()).await;
    let http = client();
    let b = pull_bearer(&http, &c).await;
    c.add_fault(Fault::status(Route::Finish, 503).after_handling())
        .unwrap();
    let finish_url = url(&c, "api/cli/workbench-runs/run-1/finish");
    let (status, _) = post_json(&http, &finish_url, &b, finish_body("failed")).await;
    assert_eq!(status, 503);
    assert_eq!(c.run("run-1").unwrap().status, "failed");
    // The retry of the same body is idempotent.
    let (status, _) = post_json(&http, &finish_url, &b, finish_body("failed")).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn wait_for_sees_changes_without_sleeping() {
    let c = start(CoordinatorOptions::default()).await;
    let http = client();
    let status_url = c.boot_status_url();
    let secret = c.boot_secret();
    let poster = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        http.post(&status_url)
            .bearer_auth(secret)
            .json(&json!({"status": "ready"}))
            .send()
            .await
            .unwrap();
    });
    let snap = c
        .wait_for(WAIT, |s| s.status_names() == ["ready"])
        .await
        .unwrap();
    assert_eq!(snap.requests_to(Route::BootStatus).len(), 1);
    poster.await.unwrap();
    let err = c
        .wait_for(Duration::from_millis(50), |s| s.statuses.len() == 2)
        .await
        .unwrap_err();
    assert!(matches!(err, DevError::Timeout { .. }), "{err}");
}

#[tokio::test]
async fn the_dev_api_needs_a_token_off_loopback() {
    let c = start(CoordinatorOptions {
        listen: "0.0.0.0:0".parse().unwrap(),
        ..CoordinatorOptions::default()
    })
    .await;
    let token = c.dev_token().expect("a dev token off loopback");
    assert!(c.base_url().as_str().starts_with("http://127.0.0.1:"));
    let http = client();
    let (status, _) = get_json(&http, &url(&c, "dev/state"), "wrong").await;
    assert_eq!(status, 401);
    let (status, _) = get_json(&http, &url(&c, "dev/state"), &token).await;
    assert_eq!(status, 200);
    let text = c.startup_text(Path::new(env!("CARGO_BIN_EXE_hosted-boot")));
    assert!(text.contains(&token));
    assert!(text.contains("HOSTED_BOOT_INSECURE_HTTP=1"));

    let local = start(CoordinatorOptions::default()).await;
    assert_eq!(local.dev_token(), None);
}

/// `GET dev/requests` as a table for a person (`?format=table` or
/// `Accept: text/plain`): the runner's calls in one table, the dev API's in
/// another, in order, with route, status and time; no authorization value.
/// Without either it stays JSON.
#[tokio::test]
async fn the_dev_api_returns_the_request_log_as_a_table() {
    let c = start(CoordinatorOptions::default()).await;
    let http = client();
    let b = pull_bearer(&http, &c).await;
    let (status, _) = get_json(&http, &url(&c, "api/cli/sessions/s1"), &b).await;
    assert_eq!(status, 200);
    let (status, _) = get_json(&http, &url(&c, "dev/state"), "").await;
    assert_eq!(status, 200);
    let by_query = http
        .get(url(&c, "dev/requests?format=table"))
        .send()
        .await
        .unwrap();
    assert_eq!(by_query.status(), 200);
    assert_eq!(
        by_query.headers()["content-type"],
        "text/plain; charset=utf-8"
    );
    let table = by_query.text().await.unwrap();
    let by_accept = http
        .get(url(&c, "dev/requests"))
        .header("accept", "text/plain")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let (runner, dev) = table.split_once("\ndev calls (").expect(&table);
    let runner_rows: Vec<&str> = runner.lines().skip(2).collect();
    assert!(runner.starts_with("runner calls (2)\n"), "{table}");
    assert_eq!(runner_rows.len(), 2, "{table}");
    let words = |l: &str| l.split_whitespace().map(String::from).collect::<Vec<_>>();
    let first = words(runner_rows[0]);
    assert_eq!(
        first[1..5],
        [
            "GET",
            "/api/cli/sessions/s1/agent-token",
            "agent-token",
            "200"
        ],
        "{table}"
    );
    assert!(
        first[0].ends_with('s') && first.last().unwrap() == "ms",
        "{table}"
    );
    assert_eq!(
        words(runner_rows[1])[1..5],
        ["GET", "/api/cli/sessions/s1", "session", "200"],
        "{table}"
    );
    assert!(!runner.contains("/dev/"), "{table}");
    // The dev calls: the state read, then this very request (in flight:
    // no status yet).
    let dev_rows: Vec<Vec<String>> = dev.lines().skip(2).map(words).collect();
    assert!(dev.starts_with("2)\n"), "{table}");
    assert_eq!(
        dev_rows[0][1..5],
        ["GET", "/dev/state", "dev", "200"],
        "{table}"
    );
    assert_eq!(
        dev_rows[1][1..5],
        ["GET", "/dev/requests", "dev", "…"],
        "{table}"
    );
    assert!(
        !table.contains(&b) && !table.contains(&c.boot_secret()),
        "{table}"
    );
    assert!(!table.contains("Bearer"), "{table}");
    // The Accept form: the same runner table, one more dev call.
    assert!(by_accept.starts_with(runner), "{by_accept}");
    assert!(by_accept.contains("\ndev calls (3)\n"), "{by_accept}");
    // Without either: JSON, as before.
    let (status, json) = get_json(&http, &url(&c, "dev/requests"), "").await;
    assert_eq!(status, 200);
    assert_eq!(json.as_array().unwrap().len(), 6, "{json}");
}

#[tokio::test]
async fn startup_text_has_the_env_docker_and_curl_lines() {
    let c = start(CoordinatorOptions::default()).await;
    let text = c.startup_text(Path::new(env!("CARGO_BIN_EXE_hosted-boot")));
    let base = c.base_url().to_string();
    assert!(text.contains(&base));
    // `mkdir -p <root> && env … run` (the line runs as pasted).
    let env_line = text
        .lines()
        .find(|l| l.trim_start().starts_with("mkdir -p ") && l.contains(" && env "))
        .unwrap();
    let docker_line = text
        .lines()
        .find(|l| l.trim_start().starts_with("docker run"))
        .unwrap();
    assert!(docker_line.contains("--network host"));
    for (k, v) in c.sandbox_env() {
        assert!(env_line.contains(&format!("{k}={v}")), "{k} in {env_line}");
        assert!(
            docker_line.contains(&format!("-e {k}={v}")),
            "{k} in {docker_line}"
        );
    }
    assert!(
        text.lines()
            .any(|l| l.contains(&format!("curl -sS '{base}dev/requests?format=table'"))),
        "a curl line for the request table:\n{text}"
    );
    for route in ["turns", "interrupt", "end", "state", "requests"] {
        assert!(
            text.lines()
                .any(|l| l.contains("curl") && l.contains(&format!("{base}dev/{route}"))),
            "curl line for {route}"
        );
    }
    let env: Vec<(String, String)> = c.sandbox_env();
    let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "ORIZU_BOOT_SECRET",
            "ORIZU_AGENT_TOKEN_URL",
            "ORIZU_API_BASE_URL",
            "ORIZU_SESSION_ID",
            "ORIZU_BOOT_STATUS_URL",
            "HOSTED_BOOT_GIT_BASE_URL"
        ]
    );
    assert_eq!(env[1].1, format!("{base}api/cli/sessions/s1/agent-token"));
    assert_eq!(env[4].1, format!("{base}api/cli/sessions/s1/boot-status"));
    assert_eq!(env[5].1, format!("{base}git"));
}

// ---- git ----

async fn repo_token(c: &Coordinator, http: &reqwest::Client, access: &str) -> String {
    let b = pull_bearer(http, c).await;
    let (status, body) = post_json(
        http,
        &url(c, "api/cli/sessions/s1/repo-token"),
        &b,
        json!({"access": access}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["repoFullName"], "acme/app");
    humantime::parse_rfc3339_weak(body["expiresAt"].as_str().unwrap()).unwrap();
    body["token"].as_str().unwrap().to_string()
}

/// Runs git (isolated from the user's configuration) with the repo token in
/// an `http.extraHeader`, never in a URL.
async fn git(dir: &Path, token: Option<&str>, args: &[&str]) -> std::process::Output {
    let mut cmd = tokio::process::Command::new("git");
    if let Some(token) = token {
        let basic =
            base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{token}"));
        cmd.arg("-c")
            .arg(format!("http.extraHeader=Authorization: Basic {basic}"));
    }
    cmd.args([
        "-c",
        "user.name=Test",
        "-c",
        "user.email=test@example.invalid",
    ])
    .args(["-c", "commit.gpgsign=false"])
    .args(args)
    .current_dir(dir)
    .env("GIT_TERMINAL_PROMPT", "0")
    .env("GIT_CONFIG_NOSYSTEM", "1")
    .env("GIT_CONFIG_GLOBAL", "/dev/null")
    .env_remove("GIT_ASKPASS")
    .env_remove("SSH_ASKPASS");
    cmd.output().await.unwrap()
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn bare_rev(c: &Coordinator, rev: &str) -> Option<String> {
    let o = std::process::Command::new("git")
        .arg("-C")
        .arg(c.bare_repo())
        .args(["rev-parse", "--verify", "--quiet", rev])
        .output()
        .unwrap();
    o.status.success().then(|| stdout(&o))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_clone_and_push_through_smart_http() {
    let c = start(CoordinatorOptions::default()).await;
    let http = client();
    let tmp = tempfile::tempdir().unwrap();
    let read = repo_token(&c, &http, "read").await;
    let write = repo_token(&c, &http, "write").await;
    assert_eq!(c.clone_url(), format!("{}git/acme/app.git", c.base_url()));

    let o = git(
        tmp.path(),
        Some(&read),
        &[
            "clone",
            "--branch",
            "orizu/session-1",
            &c.clone_url(),
            "repo",
        ],
    )
    .await;
    assert!(
        o.status.success(),
        "clone: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let repo = tmp.path().join("repo");
    assert!(repo.join("README.md").is_file());

    std::fs::write(repo.join("NOTES.md"), "pushed by the test\n").unwrap();
    assert!(
        git(&repo, None, &["add", "NOTES.md"])
            .await
            .status
            .success()
    );
    assert!(
        git(&repo, None, &["commit", "-q", "-m", "Add notes"])
            .await
            .status
            .success()
    );
    let head = stdout(&git(&repo, None, &["rev-parse", "HEAD"]).await);

    // A read token cannot push.
    let o = git(
        &repo,
        Some(&read),
        &["push", "origin", "HEAD:refs/heads/orizu/session-1"],
    )
    .await;
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("403"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // A write token pushes the session branch, and a recovery branch.
    let o = git(
        &repo,
        Some(&write),
        &["push", "origin", "HEAD:refs/heads/orizu/session-1"],
    )
    .await;
    assert!(
        o.status.success(),
        "push: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        bare_rev(&c, "refs/heads/orizu/session-1"),
        Some(head.clone())
    );
    let o = git(
        &repo,
        Some(&write),
        &[
            "push",
            "origin",
            "HEAD:refs/heads/orizu/session-1-recovered-run-1",
        ],
    )
    .await;
    assert!(
        o.status.success(),
        "push: {}",
        String::from_utf8_lossy(&o.stderr)
    );

    // Elsewhere is refused by the pre-receive hook.
    let o = git(
        &repo,
        Some(&write),
        &["push", "origin", "HEAD:refs/heads/main"],
    )
    .await;
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("refused"));
    assert_ne!(bare_rev(&c, "refs/heads/main"), Some(head));

    let reqs = c.requests();
    let git_reqs: Vec<_> = reqs.iter().filter(|r| r.route == Target::Git).collect();
    assert!(git_reqs.len() >= 4);
    assert!(git_reqs.iter().all(|r| r.body.is_null()));
    assert!(
        git_reqs
            .iter()
            .filter_map(|r| r.header("authorization"))
            .all(|a| a == "Basic ***")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_refuses_a_wrong_password() {
    let c = start(CoordinatorOptions::default()).await;
    let http = client();
    let info_refs = format!("{}/info/refs?service=git-upload-pack", c.clone_url());
    let resp = http
        .get(&info_refs)
        .basic_auth("x-access-token", Some("not-a-token"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert!(
        resp.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .starts_with("Basic")
    );
    let resp = http.get(&info_refs).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    // The right password with another user is refused too.
    let token = repo_token(&c, &http, "read").await;
    let resp = http
        .get(&info_refs)
        .basic_auth("someone", Some(&token))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let resp = http
        .get(&info_refs)
        .basic_auth("x-access-token", Some(&token))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // Another repository is not served.
    let other = format!(
        "{}git/acme/other.git/info/refs?service=git-upload-pack",
        c.base_url()
    );
    let resp = http
        .get(&other)
        .basic_auth("x-access-token", Some(&token))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);

    let tmp = tempfile::tempdir().unwrap();
    let o = git(
        tmp.path(),
        Some("wrong-token"),
        &["clone", &c.clone_url(), "repo"],
    )
    .await;
    assert!(!o.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_branch_can_be_left_missing() {
    let c = start(CoordinatorOptions {
        create_branch: false,
        ..CoordinatorOptions::default()
    })
    .await;
    assert_eq!(bare_rev(&c, "refs/heads/orizu/session-1"), None);
    assert!(bare_rev(&c, "refs/heads/main").is_some());
    assert_eq!(c.default_branch(), "main");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_repository_is_served() {
    let tmp = tempfile::tempdir().unwrap();
    let src = hosted_boot_coordinator::create_sample_repo(&tmp.path().join("src")).unwrap();
    std::fs::write(src.join("EXTRA.md"), "extra\n").unwrap();
    assert!(git(&src, None, &["add", "EXTRA.md"]).await.status.success());
    assert!(
        git(&src, None, &["commit", "-q", "-m", "Extra"])
            .await
            .status
            .success()
    );
    let head = stdout(&git(&src, None, &["rev-parse", "HEAD"]).await);
    let c = start(CoordinatorOptions {
        source_repo: Some(src),
        workdir: Some(tmp.path().join("work")),
        branch: "feature/x".into(),
        ..CoordinatorOptions::default()
    })
    .await;
    assert!(c.bare_repo().starts_with(tmp.path().join("work")));
    assert_eq!(bare_rev(&c, "refs/heads/feature/x"), Some(head));
}

/// `hosted-boot-coordinator serve` on an ephemeral loopback port, started
/// in `work`; its stdout as lines (its startup text first).
fn serve(
    work: &Path,
) -> (
    tokio::process::Child,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) {
    use tokio::io::AsyncBufReadExt;
    let mut coord = tokio::process::Command::new(coordinator_bin())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .current_dir(work)
        .env("TMPDIR", work)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = tokio::io::BufReader::new(coord.stdout.take().unwrap()).lines();
    (coord, stdout)
}

/// `hosted-boot-coordinator serve` prints an `env` line that runs as pasted
/// (the runner binary's real path, found beside the coordinator's, a root
/// of its own, the built-in demo agent by `HOSTED_BOOT_AGENT=demo`): run by
/// `sh` on a terminal (`script`'s) exactly as printed, it boots, runs the
/// initial task as run-1 and exits 0 when the session ends.
///
/// Issue 45, logs for people: on that terminal the runner's lines are the
/// time and what happened, without tracing's prefixes, and a turn ends with
/// one summary line; the coordinator prints each request once answered,
/// in the order of its stamps (the runner's apart from the dev API's), and
/// a line per sealed turn.
#[tokio::test]
async fn the_printed_env_line_runs_as_pasted() {
    if let Err(reason) = hosted_boot_test_support::program("script", "bsdutils (util-linux)") {
        hosted_boot_test_support::skip(reason);
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (mut coord, mut stdout) = serve(work.path());
    let (mut base, mut env_line) = (None, None);
    while env_line.is_none() {
        let line = tokio::time::timeout(WAIT, stdout.next_line())
            .await
            .unwrap()
            .unwrap()
            .expect("the coordinator ended");
        if let Some(url) = line.strip_prefix("hosted-boot-coordinator: session s1 on ") {
            base = Some(url.to_string());
        }
        if line.starts_with("  mkdir -p ") {
            env_line = Some(line.trim().to_string());
        }
    }
    let (base, env_line) = (base.unwrap(), env_line.unwrap());
    assert!(
        env_line.contains(&format!("{} run", env!("CARGO_BIN_EXE_hosted-boot"))),
        "{env_line}"
    );
    // The built-in demo agent, chosen by name (`--agent demo`), not a
    // command to edit.
    assert!(env_line.contains(" HOSTED_BOOT_AGENT=demo "), "{env_line}");
    assert!(
        !env_line.contains("HOSTED_BOOT_AGENT_COMMAND"),
        "{env_line}"
    );
    let mut runner = tokio::process::Command::new("script")
        .args(["-qefc", &env_line, "/dev/null"])
        .current_dir(work.path())
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let terminal = tokio::spawn({
        use tokio::io::AsyncReadExt;
        let mut out = runner.stdout.take().unwrap();
        async move {
            let mut bytes = Vec::new();
            let _ = out.read_to_end(&mut bytes).await;
            bytes
        }
    });
    let http = client();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let state: Value = http
            .get(format!("{base}dev/state"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let sealed = state["runs"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["id"] == "run-1"))
            .is_some_and(|r| r["status"] == "succeeded");
        if sealed {
            break;
        }
        assert!(Instant::now() < deadline, "run-1 was not sealed: {state}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    http.post(format!("{base}dev/end")).send().await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(60), runner.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let _ = coord.start_kill();
    let out = coord.wait_with_output().await.unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.lines()
            .any(|l| l.contains("  runner  GET  /api/cli/sessions/s1/agent-token  200")),
        "{log}"
    );
    assert!(
        log.lines().any(|l| l.contains("  dev     POST /dev/end  ")),
        "{log}"
    );
    let stamps: Vec<f64> = log
        .lines()
        .filter_map(|l| l.trim_start().split_once("s  ")?.0.parse().ok())
        .collect();
    assert!(stamps.len() > 5, "{log}");
    assert!(
        stamps.windows(2).all(|w| w[0] <= w[1]),
        "the request lines are not in the order of their stamps:\n{log}"
    );
    let turns: Vec<&str> = log.lines().filter(|l| l.contains("  turn    ")).collect();
    assert_eq!(turns.len(), 1, "one line per sealed turn:\n{log}");
    assert!(
        turns[0].contains("turn    turn 1 (run-1) succeeded in ")
            && turns[0].contains(" events · pushed 1 commit to "),
        "{log}"
    );
    assert_logs_for_people(&terminal.await.unwrap());
}

/// The runner's lines on a terminal (`script`'s output: each log line is
/// written after the status line's erase, `\r\x1b[2K`).
fn assert_logs_for_people(terminal: &[u8]) {
    let text = String::from_utf8_lossy(terminal);
    let lines: Vec<&str> = text
        .split("\r\x1b[2K")
        .filter_map(|chunk| {
            chunk
                .split_once('\n')
                .map(|(line, _)| line.trim_end_matches('\r'))
        })
        .filter(|l| !l.is_empty())
        .collect();
    assert!(lines.len() > 5, "{text:?}");
    for line in &lines {
        let (time, rest) = line
            .split_at_checked(12)
            .unwrap_or_else(|| panic!("{line:?}"));
        assert!(
            time.bytes().enumerate().all(|(i, b)| match i {
                2 | 5 => b == b':',
                8 => b == b'.',
                _ => b.is_ascii_digit(),
            }) && rest.starts_with("  "),
            "a line for people starts with the time of day: {line:?}\n{text:?}"
        );
        for prefix in [" INFO ", "hosted_boot::", "boot{", "turn{", "step{"] {
            assert!(!line.contains(prefix), "tracing's {prefix:?} in {line:?}");
        }
    }
    let summaries: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains("  turn 1 (run-1) "))
        .collect();
    assert_eq!(
        summaries.len(),
        1,
        "one summary line for the turn: {lines:#?}"
    );
    assert!(
        summaries[0].contains("  turn 1 (run-1) succeeded in ")
            && summaries[0].contains(" events · pushed 1 commit to "),
        "{lines:#?}"
    );
}

/// Issue 45: the debugging path as printed. The coordinator's lines, pasted
/// into a shell in order: the sandbox's `env` line, the slow turn's `curl`,
/// the interrupt's, the end's. The slow turn is still at work when the
/// interrupt comes (the demo agent finishes an ordinary turn in
/// milliseconds, which left the printed interrupt nothing to interrupt),
/// and the text names where the runner is.
#[tokio::test]
async fn the_printed_debugging_path_runs_as_pasted_and_interrupts_a_slow_turn() {
    if let Err(reason) = hosted_boot_test_support::program("curl", "curl") {
        hosted_boot_test_support::skip(reason);
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (_coord, mut stdout) = serve(work.path());
    let mut text = Vec::new();
    while !text
        .last()
        .is_some_and(|l: &String| l.starts_with("Ctrl-C"))
    {
        let line = tokio::time::timeout(WAIT, stdout.next_line())
            .await
            .unwrap()
            .unwrap()
            .expect("the coordinator ended");
        text.push(line);
    }
    let all = text.join("\n");
    let pasted = |starts: &str, has: &str| -> String {
        text.iter()
            .map(|l| l.trim())
            .find(|l| l.starts_with(starts) && l.contains(has))
            .unwrap_or_else(|| panic!("no line {starts}…{has} in:\n{all}"))
            .to_string()
    };
    assert!(
        all.contains(&format!(
            "(The runner above is {}",
            env!("CARGO_BIN_EXE_hosted-boot")
        )),
        "{all}"
    );
    let base = pasted("hosted-boot-coordinator: session", "")
        .rsplit(' ')
        .next()
        .unwrap()
        .to_string();
    let sh = |line: &str| {
        let mut c = tokio::process::Command::new("sh");
        c.arg("-c")
            .arg(line)
            .current_dir(work.path())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        c
    };
    let mut runner = sh(&pasted("mkdir -p ", "")).spawn().unwrap();
    let http = client();
    let state = || async {
        http.get(format!("{base}dev/state"))
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    };
    let run = |state: &Value, id: &str| -> Value {
        state["runs"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["id"] == id).cloned())
            .unwrap_or(Value::Null)
    };
    let wait_until = |what: &'static str, id: &'static str, cond: fn(&Value) -> bool| {
        let state = &state;
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let s = state().await;
                if cond(&run(&s, id)) {
                    return;
                }
                assert!(Instant::now() < deadline, "{id}: {what}: {s}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    wait_until("sealed", "run-1", |r| r["status"] == "succeeded").await;
    let status = sh(&pasted("curl", "full test suite"))
        .status()
        .await
        .unwrap();
    assert!(status.success());
    wait_until("at work", "run-2", |r| {
        r["status"] == "running"
            && r["events"].as_array().is_some_and(|e| {
                e.iter().any(|e| {
                    e["data"]["text"]
                        .as_str()
                        .is_some_and(|t| t.starts_with("running test"))
                })
            })
    })
    .await;
    assert!(
        sh(&pasted("curl", "/dev/interrupt"))
            .status()
            .await
            .unwrap()
            .success()
    );
    wait_until("interrupted", "run-2", |r| r["status"] == "interrupted").await;
    assert!(
        sh(&pasted("curl", "/dev/end"))
            .status()
            .await
            .unwrap()
            .success()
    );
    let status = tokio::time::timeout(Duration::from_secs(60), runner.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

/// The subcommands that left the runner (issue 34) say where they went,
/// exit 2, and never start anything.
#[test]
fn the_runner_names_where_its_old_subcommands_went() {
    for (old, new) in [
        ("coordinator", "hosted-boot-coordinator serve"),
        ("demo", "hosted-boot-coordinator demo"),
        ("conformance", "hosted-boot-conformance"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hosted-boot"))
            .args([old, "--listen", "127.0.0.1:0"])
            .env_remove("ORIZU_BOOT_SECRET")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{old}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "`{old}` is no longer a subcommand of the runner; run `{new}`"
            )),
            "{old}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{old}");
    }
}
