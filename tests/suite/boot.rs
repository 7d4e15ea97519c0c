//! The boot end to end (PROTOCOL.md section 4): the real binary against the
//! reference coordinator on loopback, a real git repository over smart HTTP,
//! real agent processes.

use std::time::Duration;

use hosted_boot::wire::AnswerToQuestion;
use hosted_boot_coordinator::{CoordinatorOptions, Fault, Route, Snapshot, Target};
use pretty_assertions::assert_eq;
use serde_json::json;

use super::support::{Sandbox, WAIT, assert_no_secret, finish, signal};

const CONNECTOR: (&str, &str) = ("ACME_API_KEY", "acme-connector-value-42");

/// An agent that records what it saw and says hello.
const OBSERVER: &str = r#"
env > "$AGENT_OUT/env-$ORIZU_RUN_ID"
cat "$ORIZU_TOKEN_FILE" > "$AGENT_OUT/bearer-$ORIZU_RUN_ID"
cat > "$AGENT_OUT/prompt-$ORIZU_RUN_ID"
pwd > "$AGENT_OUT/cwd-$ORIZU_RUN_ID"
echo '{"type":"message","text":"hello"}'
echo 'plain line'
echo 'to stderr' >&2
"#;

fn routes(s: &Snapshot) -> Vec<String> {
    s.requests
        .iter()
        .filter(|r| r.route != Target::Dev)
        .map(|r| match r.route {
            Target::Route(Route::BootStatus) => {
                format!("status:{}", r.body["status"].as_str().unwrap_or("?"))
            }
            Target::Git => "git".to_string(),
            other => other.name().to_string(),
        })
        .collect()
}

/// The tip of `branch` in the coordinator's bare repository.
fn remote_tip(sb: &Sandbox, branch: &str) -> String {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(sb.coordinator.bare_repo())
        .args(["rev-parse", branch])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn dedup(v: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in v {
        if out.last() != Some(&s) {
            out.push(s);
        }
    }
    out
}

#[tokio::test]
async fn happy_path_one_turn_then_the_session_ends() {
    let sb = Sandbox::with_connectors(&[CONNECTOR]).await;
    let child = sb.spawn(&sb.script(OBSERVER));
    let (_, output) = sb.end_after_seal("run-1", child).await;

    let snap = sb.coordinator.snapshot();
    let seen = routes(&snap);
    // Boot: the bearer, then the three step-3 reads in any order.
    assert_eq!(seen[0], "agent-token");
    let mut step3 = seen[1..4].to_vec();
    step3.sort();
    assert_eq!(step3, vec!["env-bundle", "repo-token", "session"]);
    // Then the clone through the credential helper (its own agent-token and
    // repo-token calls interleave with git's), then the turn.
    let after = dedup(seen[4..].to_vec());
    let turn_at = after
        .iter()
        .position(|s| s == "status:turn_started")
        .unwrap();
    let clone: Vec<&str> = after[..turn_at].iter().map(String::as_str).collect();
    assert!(clone.contains(&"git"), "{clone:?}");
    assert!(
        clone
            .iter()
            .all(|s| ["git", "agent-token", "repo-token"].contains(s)),
        "{clone:?}"
    );
    let turn: Vec<&str> = after[turn_at..].iter().map(String::as_str).collect();
    assert_eq!(
        turn[..2].to_vec(),
        vec!["status:turn_started", "run-started"],
        "{turn:?}"
    );
    // The workspace sync's fetch (git, through the credential helper), then
    // the interrupt watch's first read, before the agent starts (4.1 step 3).
    let first_read = turn.iter().position(|s| *s == "session").unwrap();
    assert!(turn[2..first_read].contains(&"git"), "{turn:?}");
    assert!(
        turn[2..first_read]
            .iter()
            .all(|s| ["git", "agent-token", "repo-token", "events"].contains(s)),
        "{turn:?}"
    );
    let finish_at = turn.iter().position(|s| *s == "finish").unwrap();
    // Events and watch reads, then the harvest's fetch (git, through the
    // credential helper) before the seal.
    assert!(
        turn[3..finish_at].iter().all(|s| [
            "events",
            "session",
            "git",
            "agent-token",
            "repo-token"
        ]
        .contains(s)),
        "{turn:?}"
    );
    assert!(turn[3..finish_at].contains(&"git"), "{turn:?}");
    assert_eq!(turn[finish_at + 1], "status:turn_completed");
    assert!(
        turn[finish_at + 2..turn.len() - 1]
            .iter()
            .all(|s| *s == "session"),
        "{turn:?}"
    );
    assert_eq!(*turn.last().unwrap(), "status:complete");
    assert_eq!(
        snap.status_names(),
        vec!["turn_started", "turn_completed", "complete"]
    );
    // The interrupt watch reads carry the during-turn header; idle reads don't.
    let watch_reads: Vec<_> = snap
        .requests
        .iter()
        .filter(|r| r.route == Route::Session && r.header("x-orizu-hosted-poll").is_some())
        .collect();
    assert!(!watch_reads.is_empty());
    assert!(
        watch_reads
            .iter()
            .all(|r| r.header("x-orizu-hosted-poll") == Some("during-turn"))
    );

    // The run: sealed succeeded, events in order, the runner's event first.
    let run = snap.run("run-1").unwrap();
    assert_eq!(run.status, "succeeded");
    let f = run.finish.as_ref().unwrap();
    let branch = sb.coordinator.branch();
    let tip = remote_tip(&sb, &branch);
    // Nothing to harvest: the result says where the work is all the same.
    // What the agent used is measured (finish.resources), its figures
    // this machine's.
    let mut body = serde_json::to_value(f).unwrap();
    let resources = body.as_object_mut().unwrap().remove("resources").unwrap();
    assert!(
        resources["source"] == "rusage" || resources["source"] == "cgroup",
        "{resources}"
    );
    assert_eq!(
        body,
        json!({"status": "succeeded", "agentSessionId": null, "error": null, "usage": null,
               "result": {"name": "run-1", "branch": branch, "headSha": tip, "pushed": true,
                          "commits": 0, "filesChanged": 0, "insertions": 0, "deletions": 0}})
    );
    let kinds: Vec<&str> = run.events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds[0], "hosted_boot.runner");
    assert!(
        kinds.contains(&"message") && kinds.contains(&"output") && kinds.contains(&"stderr"),
        "{kinds:?}"
    );
    let seqs: Vec<u64> = run.events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=run.events.len() as u64).collect::<Vec<_>>());
    let output_event = run.events.iter().find(|e| e.kind == "output").unwrap();
    assert_eq!(output_event.data, json!({"text": "plain line"}));

    // What the agent saw.
    let env = sb.read_out("env-run-1");
    assert!(
        env.contains(&format!("{}={}", CONNECTOR.0, CONNECTOR.1)),
        "{env}"
    );
    assert!(
        !env.contains("ORIZU_BOOT_SECRET"),
        "the agent saw the boot secret variable"
    );
    assert!(!env.contains(&sb.coordinator.boot_secret()));
    assert!(env.contains("GIT_TERMINAL_PROMPT=0"));
    assert!(env.contains(&format!("ORIZU_INJECTED_ENV_VARS={}", CONNECTOR.0)));
    assert!(env.contains("ORIZU_RUN_ID=run-1"));
    // The agent API proxy (the default): the bearer file holds the turn's
    // proxy token, 64 hex characters, which the coordinator never issued.
    let token = sb.read_out("bearer-run-1");
    let token = token.trim();
    assert!(
        token.len() == 64 && token.bytes().all(|b| b.is_ascii_hexdigit()),
        "the bearer file did not hold a proxy token"
    );
    assert!(
        !sb.coordinator.issued_secrets().contains(&token.to_string()),
        "the bearer file held a secret the coordinator issued"
    );
    assert!(
        env.contains("ORIZU_API_BASE_URL=http://127.0.0.1:"),
        "{env}"
    );
    assert_eq!(
        sb.read_out("prompt-run-1"),
        CoordinatorOptions::default().task
    );
    assert_eq!(
        sb.read_out("cwd-run-1").trim(),
        sb.root().join("repo").to_string_lossy()
    );

    // Files: the session directory and the run directory are gone, the clone stays.
    assert!(!sb.session_dir().exists());
    assert!(!sb.root().join(".orizu-run/run-1").exists());
    assert!(sb.root().join("repo/.git").exists());
    assert_no_secret("runner output", &output, &sb.secrets(&[CONNECTOR.1]));
}

#[tokio::test]
async fn idle_start_posts_ready_then_runs_a_queued_turn() {
    let sb = Sandbox::start(CoordinatorOptions {
        start_idle: true,
        ..CoordinatorOptions::default()
    })
    .await;
    let child = sb.spawn(&sb.script(OBSERVER));
    sb.coordinator
        .wait_for(WAIT, |s| s.status_names() == vec!["ready"])
        .await
        .unwrap();
    // No clone before there is something to run.
    assert!(
        !sb.coordinator
            .snapshot()
            .requests
            .iter()
            .any(|r| r.route == Target::Git)
    );
    let run_id = sb.coordinator.queue_turn(
        "Yes, use tabs.",
        Some(AnswerToQuestion {
            question_id: "q1".into(),
            question: "Tabs or spaces?".into(),
        }),
    );
    sb.end_after_seal(&run_id, child).await;
    assert_eq!(
        sb.read_out(&format!("prompt-{run_id}")),
        "The user answered your earlier question.\n\nQuestion: Tabs or spaces?\n\nAnswer: Yes, use tabs."
    );
    assert_eq!(
        sb.coordinator.snapshot().status_names(),
        vec!["ready", "turn_started", "turn_completed", "complete"]
    );
}

#[tokio::test]
async fn an_interrupted_turn_leaves_no_process_and_the_next_turn_runs() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    // The first turn sleeps in a background job (which ignores SIGINT, so
    // the group needs SIGKILL after the grace period); later turns observe.
    let script = sb.script(&format!(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  record_group > "$AGENT_OUT/pgid"
  echo '{{"type":"message","text":"sleeping"}}'
  sleep 1000 &
  wait
  exit 7
fi
{OBSERVER}"#
    ));
    let child = sb.spawn(&script);
    sb.wait_event("run-1", "message", |e| e.kind == "message")
        .await;
    sb.coordinator.interrupt(Some("run-1")).unwrap();
    let snap = sb.wait_sealed("run-1").await;
    assert_eq!(snap.run("run-1").unwrap().status, "interrupted");
    assert!(
        snap.run("run-1")
            .unwrap()
            .finish
            .as_ref()
            .unwrap()
            .error
            .is_none()
    );
    let group = sb.read_group("pgid");
    assert_eq!(
        group.live_members(),
        Vec::<i32>::new(),
        "the agent's process group survived the turn"
    );

    let next = sb.coordinator.queue_turn("And now?", None);
    sb.end_after_seal(&next, child).await;
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.run(&next).unwrap().status, "succeeded");
    assert_eq!(
        snap.status_names(),
        vec![
            "turn_started",
            "turn_completed",
            "turn_started",
            "turn_completed",
            "complete"
        ]
    );
}

#[tokio::test]
async fn an_interrupt_requested_before_the_agent_starts_skips_it() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    sb.coordinator.interrupt(Some("run-1")).unwrap();
    let child = sb.spawn(&sb.script(OBSERVER));
    sb.end_after_seal("run-1", child).await;
    assert_eq!(sb.coordinator.run("run-1").unwrap().status, "interrupted");
    assert_eq!(sb.read_out("env-run-1"), "", "the agent was started");
}

#[tokio::test]
async fn agent_token_503_three_times_takes_exactly_four_requests() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    sb.coordinator
        .add_fault(Fault::status(Route::AgentToken, 503).times(3))
        .unwrap();
    let child = sb.spawn(&sb.script(OBSERVER));
    sb.end_after_seal("run-1", child).await;
    let snap = sb.coordinator.snapshot();
    let first_non_token = snap
        .requests
        .iter()
        .position(|r| r.route != Route::AgentToken)
        .unwrap();
    assert_eq!(first_non_token, 4, "{:?}", routes(&snap));
}

#[tokio::test]
async fn agent_token_401_is_a_verdict_and_fails_the_boot() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    sb.coordinator
        .add_fault(Fault::status(Route::AgentToken, 401).times(5))
        .unwrap();
    let (status, output) = finish(sb.spawn(&sb.script(OBSERVER))).await;
    assert_eq!(status.code(), Some(1), "{output}");
    let snap = sb.coordinator.snapshot();
    assert_eq!(routes(&snap), vec!["agent-token", "status:failed"]);
    let failed = &snap.statuses[0];
    assert_eq!(failed.run_id, Some(None));
    assert!(
        failed.reason.as_deref().unwrap().contains("401"),
        "{failed:?}"
    );
    assert!(!sb.session_dir().exists());
}

#[tokio::test]
async fn turn_started_exhausted_seals_the_run_failed_and_starts_no_agent() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    sb.coordinator
        .add_fault(Fault::status(Route::BootStatus, 503).times(5))
        .unwrap();
    let (status, output) = finish(sb.spawn(&sb.script(OBSERVER))).await;
    assert_eq!(status.code(), Some(1), "{output}");
    let snap = sb.coordinator.snapshot();
    let statuses: Vec<_> = snap
        .requests
        .iter()
        .filter(|r| r.route == Route::BootStatus)
        .collect();
    assert_eq!(
        statuses.len(),
        6,
        "5 turn_started attempts, then turn_failed"
    );
    assert!(
        statuses[..5]
            .iter()
            .all(|r| r.body["status"] == "turn_started" && r.body["runId"] == "run-1")
    );
    assert_eq!(statuses[5].body["status"], "turn_failed");
    assert_eq!(statuses[5].body["runId"], "run-1");
    let run = snap.run("run-1").unwrap();
    assert_eq!(run.status, "failed");
    let error = run.finish.as_ref().unwrap().error.as_ref().unwrap();
    assert_eq!(
        serde_json::to_value(error.code).unwrap(),
        json!("runner_error")
    );
    assert!(error.message.contains("turn_started"), "{}", error.message);
    assert_eq!(sb.read_out("env-run-1"), "", "the agent was started");
    assert!(!snap.requests.iter().any(|r| r.route == Route::RunStarted));
    assert!(!sb.session_dir().exists());
    assert!(
        !sb.root().join(".orizu-run/run-1").exists(),
        "the prompt file outlived the seal"
    );
}

#[tokio::test]
async fn a_failing_agent_fails_the_turn_then_the_boot() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let (status, output) = finish(sb.spawn(&sb.script("echo working; exit 3"))).await;
    assert_eq!(status.code(), Some(1), "{output}");
    let snap = sb.coordinator.snapshot();
    assert_eq!(
        snap.status_names(),
        vec!["turn_started", "turn_completed", "turn_failed"]
    );
    let run = snap.run("run-1").unwrap();
    assert_eq!(run.status, "failed");
    let error = run.finish.as_ref().unwrap().error.as_ref().unwrap();
    assert_eq!(
        serde_json::to_value(error.code).unwrap(),
        json!("agent_crashed")
    );
    assert!(error.message.contains("status 3"), "{}", error.message);
}

#[tokio::test]
async fn a_missing_agent_program_is_a_failed_turn_with_agent_spawn_failed() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let mut cmd = sb.runner(&sb.script(""));
    cmd.env("HOSTED_BOOT_AGENT_COMMAND", "/nonexistent/agent --flag");
    let (status, output) = finish(cmd.spawn().unwrap()).await;
    assert_eq!(status.code(), Some(1), "{output}");
    let run = sb.coordinator.run("run-1").unwrap();
    let error = run.finish.as_ref().unwrap().error.as_ref().unwrap();
    assert_eq!(
        serde_json::to_value(error.code).unwrap(),
        json!("agent_spawn_failed")
    );
    assert!(
        error.message.contains("/nonexistent/agent"),
        "{}",
        error.message
    );
}

#[tokio::test]
async fn a_reserved_connector_fails_the_boot_naming_the_variable() {
    let sb = Sandbox::start(CoordinatorOptions {
        connectors: vec![("LD_PRELOAD".into(), "/tmp/evil-library-value.so".into())],
        ..CoordinatorOptions::default()
    })
    .await;
    let (status, output) = finish(sb.spawn(&sb.script(OBSERVER))).await;
    assert_eq!(status.code(), Some(1), "{output}");
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.status_names(), vec!["failed"]);
    let reason = snap.statuses[0].reason.clone().unwrap();
    // Named in backticks, not as Rust's Debug text ("LD_PRELOAD").
    assert!(
        reason.starts_with("reserved_connector_env: the env bundle sets `LD_PRELOAD`, "),
        "{reason}"
    );
    assert!(!reason.contains("evil-library"), "{reason}");
    assert!(
        !snap.requests.iter().any(|r| r.route == Target::Git),
        "cloned anyway"
    );
}

#[tokio::test]
async fn an_invalid_pending_turn_fails_the_boot() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let mut session = sb.coordinator.snapshot().session;
    session.pending_turn = Some(json!({"runId": "run-9", "ordinal": "two"}));
    let body = json!({ "session": session }).to_string();
    sb.coordinator
        .add_fault(Fault::body(Route::Session, body).times(5))
        .unwrap();
    let (status, output) = finish(sb.spawn(&sb.script(OBSERVER))).await;
    assert_eq!(status.code(), Some(1), "{output}");
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.status_names(), vec!["failed"]);
    assert!(
        snap.statuses[0]
            .reason
            .as_deref()
            .unwrap()
            .starts_with("hosted_pending_turn_invalid: "),
        "{:?}",
        snap.statuses
    );
    assert!(!snap.requests.iter().any(|r| r.route == Target::Git));
}

/// Issue 30: a coordinator that adds a member the runner does not know to
/// `pendingTurn` (a trace context, a priority) still gets its turns run
/// (2, "2xx answers the runner cannot use"); before, every read failed
/// `hosted_pending_turn_invalid` and the queued turn never started.
#[tokio::test]
async fn a_pending_turn_with_members_the_runner_does_not_know_runs() {
    const READS: u32 = 100_000;
    let sb = Sandbox::start(CoordinatorOptions {
        start_idle: true,
        ..CoordinatorOptions::default()
    })
    .await;
    let serde_json::Value::Object(extra) = json!({
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "priority": {"level": 2, "tags": ["later"]},
    }) else {
        unreachable!()
    };
    // Every session read, at every depth: pendingTurn, its
    // answerToQuestion, runs, clientInfo.
    sb.coordinator
        .add_fault(Fault::add_fields(Route::Session, extra).times(READS))
        .unwrap();
    let child = sb.spawn(&sb.script(OBSERVER));
    sb.coordinator
        .wait_for(WAIT, |s| s.status_names() == vec!["ready"])
        .await
        .unwrap();
    let run_id = sb.coordinator.queue_turn(
        "go",
        Some(AnswerToQuestion {
            question_id: "q-1".into(),
            question: "Which branch?".into(),
        }),
    );
    sb.end_after_seal(&run_id, child).await;
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.run(&run_id).unwrap().status, "succeeded");
    assert!(sb.read_out(&format!("prompt-{run_id}")).contains("go"));
    let left = snap.faults.iter().map(|f| f.count).sum::<u32>();
    assert!(left < READS, "no session read carried the extra members");
    assert!(
        !snap.statuses.iter().any(|s| s
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("pending_turn_invalid"))),
        "{:?}",
        snap.statuses
    );
}

#[tokio::test]
async fn a_branch_starting_with_a_dash_fails_the_boot_before_the_clone() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let mut session = sb.coordinator.snapshot().session;
    session.repo_branch = "-upload-pack=evil".into();
    sb.coordinator
        .add_fault(Fault::body(
            Route::Session,
            json!({ "session": session }).to_string(),
        ))
        .unwrap();
    let (status, output) = finish(sb.spawn(&sb.script(OBSERVER))).await;
    assert_eq!(status.code(), Some(1), "{output}");
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.status_names(), vec!["failed"]);
    let reason = snap.statuses[0].reason.as_deref().unwrap();
    assert!(reason.starts_with("invalid_value: "), "{reason}");
    assert!(reason.contains("-upload-pack=evil"), "{reason}");
    assert!(!snap.requests.iter().any(|r| r.route == Target::Git));
}

#[tokio::test]
async fn a_missing_session_branch_fails_the_boot() {
    let sb = Sandbox::start(CoordinatorOptions {
        create_branch: false,
        ..CoordinatorOptions::default()
    })
    .await;
    let (status, output) = finish(sb.spawn(&sb.script(OBSERVER))).await;
    assert_eq!(status.code(), Some(1), "{output}");
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.status_names(), vec!["failed"]);
    let reason = snap.statuses[0].reason.as_deref().unwrap();
    // The code of PROTOCOL.md 2.2 and 3, for a coordinator to match on.
    assert!(reason.starts_with("session_branch_missing: "), "{reason}");
    assert!(reason.contains("orizu/session-1"), "{reason}");
    // A verdict: one advertisement, no retry, no partial clone left.
    assert_eq!(git_requests(&snap).len(), 1, "{:?}", git_requests(&snap));
    assert!(!sb.root().join("repo").exists());
}

#[tokio::test]
async fn configuration_errors_exit_2_without_a_single_request() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(OBSERVER);
    let cases: Vec<(&str, Option<&str>, &str)> = vec![
        ("ORIZU_SESSION_ID", Some("s1/../x"), "ORIZU_SESSION_ID"),
        ("ORIZU_BOOT_SECRET", None, "ORIZU_BOOT_SECRET is not set"),
        // Redacted wherever its bytes occur, it shredded the agent's output.
        (
            "ORIZU_BOOT_SECRET",
            Some("short-secret"),
            "ORIZU_BOOT_SECRET is 12 bytes long, shorter than the 16 bytes",
        ),
        ("HOSTED_BOOT_AGENT", None, "no agent configured"),
        (
            "ORIZU_API_BASE_URL",
            Some("http://example.com/"),
            "must be https",
        ),
        (
            "HOSTED_BOOT_INTERRUPT_GRACE",
            Some("soon"),
            "interrupt-grace",
        ),
        // Parsed by clap where declared; the message names the flag, the
        // variable and the value, as load's do.
        (
            "HOSTED_BOOT_HARVEST_MAX_FILE_SIZE",
            Some("lots"),
            "--harvest-max-file-size (HOSTED_BOOT_HARVEST_MAX_FILE_SIZE): \"lots\" is not a size",
        ),
        (
            "HOSTED_BOOT_TURN_CGROUP",
            Some("always"),
            "--turn-cgroup (HOSTED_BOOT_TURN_CGROUP): \"always\" is not one of auto, off",
        ),
        (
            "HOSTED_BOOT_SETUP_TIMEOUT",
            Some("0s"),
            "--setup-timeout (HOSTED_BOOT_SETUP_TIMEOUT): \"0s\" is not a positive duration",
        ),
        (
            "HOSTED_BOOT_EGRESS_CANARY",
            Some("blocked.example"),
            "--egress-canary (HOSTED_BOOT_EGRESS_CANARY): invalid value \"blocked.example\": no port",
        ),
        ("ORIZU_OPENCODE_PORT", Some("70000"), "ORIZU_OPENCODE_PORT"),
        (
            "HOSTED_BOOT_CA_FILE",
            Some("/nonexistent/ca.pem"),
            "/nonexistent/ca.pem",
        ),
        (
            "HOSTED_BOOT_CA_FILE",
            Some("/dev/null"),
            "holds no certificate",
        ),
        // Once skipped without a word: every handshake then failed
        // UnknownIssuer against the bundled roots.
        (
            "SSL_CERT_FILE",
            Some("/dev/null"),
            "SSL_CERT_FILE /dev/null holds no PEM certificate",
        ),
        (
            "SSL_CERT_FILE",
            Some("/nonexistent/roots.pem"),
            "cannot read SSL_CERT_FILE /nonexistent/roots.pem",
        ),
    ];
    for (var, value, expected) in cases {
        let mut cmd = sb.runner(&script);
        match value {
            Some(v) => cmd.env(var, v),
            None => cmd.env_remove(var),
        };
        let (status, output) = finish(cmd.spawn().unwrap()).await;
        assert_eq!(status.code(), Some(2), "{var}: {output}");
        assert!(output.contains(expected), "{var}: {output}");
        assert_no_secret(
            "config error output",
            &output,
            &[sb.coordinator.boot_secret(), "short-secret".into()],
        );
    }
    // Several variables at once: a file that gives nothing beside a
    // directory that gives roots (it went unnoticed in their union), and a
    // FIFO (a read of it blocked the boot before its first log line).
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("roots.pem");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let fifo = fifo.to_str().unwrap().to_string();
    let cases: Vec<(Vec<(&str, &str)>, String)> = vec![
        (
            vec![
                ("SSL_CERT_FILE", "/dev/null"),
                ("SSL_CERT_DIR", "/etc/ssl/certs"),
            ],
            "SSL_CERT_FILE /dev/null holds no PEM certificate".into(),
        ),
        (
            vec![("SSL_CERT_FILE", fifo.as_str())],
            format!("SSL_CERT_FILE {fifo} is not a regular file"),
        ),
        (
            vec![("HOSTED_BOOT_CA_FILE", fifo.as_str())],
            format!("HOSTED_BOOT_CA_FILE {fifo} is not a regular file"),
        ),
    ];
    for (vars, expected) in cases {
        let mut cmd = sb.runner(&script);
        cmd.envs(vars.iter().copied());
        let (status, output) = finish(cmd.spawn().unwrap()).await;
        assert_eq!(status.code(), Some(2), "{vars:?}: {output}");
        assert!(output.contains(&expected), "{vars:?}: {output}");
    }
    assert_eq!(sb.coordinator.snapshot().requests.len(), 0);
}

/// A PEM certificate block of `der`, whatever its content.
fn pem_block(der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut text = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        text.push_str(std::str::from_utf8(line).unwrap());
        text.push('\n');
    }
    text + "-----END CERTIFICATE-----\n"
}

/// PROTOCOL.md section 1, trust roots: a root rustls cannot parse (a
/// CERTIFICATE block whose content is not one) once failed the client
/// with "invalid peer certificate: BadEncoding", naming no file. It is
/// skipped with a warning naming its file, and the runner boots; a store
/// whose every root is such is a configuration error (not the bundled
/// roots in its place).
#[tokio::test]
async fn a_trust_store_with_one_malformed_certificate_skips_it_and_boots() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let malformed = pem_block(b"this is not a DER certificate");
    let mixed = dir.path().join("mixed-roots.pem");
    let valid = pem_block(webpki_root_certs::TLS_SERVER_ROOT_CERTS[0].as_ref());
    std::fs::write(&mixed, format!("{valid}{malformed}")).unwrap();
    let mut cmd = sb.runner(&sb.script(OBSERVER));
    cmd.env("SSL_CERT_FILE", &mixed).env_remove("SSL_CERT_DIR");
    let (_, output) = sb.end_after_seal("run-1", cmd.spawn().unwrap()).await;
    let warning = output
        .lines()
        .find(|l| l.contains("rustls cannot parse"))
        .unwrap_or_else(|| panic!("no warning of the skipped root: {output}"));
    assert!(warning.contains(mixed.to_str().unwrap()), "{warning}");
    assert!(warning.contains(r#""skipped":1"#), "{warning}");

    let only_bad = dir.path().join("bad-roots.pem");
    std::fs::write(&only_bad, &malformed).unwrap();
    let mut cmd = sb.runner(&sb.script(OBSERVER));
    cmd.env("SSL_CERT_FILE", &only_bad)
        .env_remove("SSL_CERT_DIR");
    let (status, output) = finish(cmd.spawn().unwrap()).await;
    assert_eq!(status.code(), Some(2), "{output}");
    assert!(
        output.contains(&format!(
            "no trust root of the system store can be used: rustls cannot parse the 1 certificate(s) of {}",
            only_bad.display()
        )),
        "{output}"
    );
}

/// Issue 15: a transport error once read `connection failed: error
/// sending request: client error (Connect): tcp connect error: Connection
/// refused (os error 111)`, the HTTP stack's layers by their internal
/// names. It says what happened, and where, in words.
#[tokio::test]
async fn a_refused_connection_is_said_in_words_naming_the_host_and_port() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cmd = sb.runner(&sb.script(OBSERVER));
    cmd.env(
        "ORIZU_AGENT_TOKEN_URL",
        format!("http://127.0.0.1:{port}/api/cli/sessions/s1/agent-token"),
    );
    let (status, output) = finish(cmd.spawn().unwrap()).await;
    assert_eq!(status.code(), Some(1), "{output}");
    assert!(
        output.contains(&format!(
            "agent-token pull failed after 10 attempts: connection refused by 127.0.0.1:{port} (nothing listens there)"
        )),
        "{output}"
    );
    assert!(!output.contains("client error ("), "{output}");
    assert!(!output.contains("error sending request"), "{output}");
}

#[tokio::test]
async fn secrets_never_reach_the_coordinator_or_the_log() {
    let sb = Sandbox::with_connectors(&[CONNECTOR]).await;
    // Once whole, once split across two writes with a pause, once inside a
    // JSON event, plus the bearer the agent can read.
    let script = sb.script(
        r#"
echo "whole: $ACME_API_KEY"
half=$(printf %s "$ACME_API_KEY" | cut -c1-10)
rest=$(printf %s "$ACME_API_KEY" | cut -c11-)
printf 'split: %s' "$half"; sleep 0.3; printf '%s\n' "$rest"
printf '{"type":"message","text":"key=%s"}\n' "$ACME_API_KEY"
echo "bearer: $(cat "$ORIZU_TOKEN_FILE")" >&2
"#,
    );
    let child = sb.spawn(&script);
    let (_, output) = sb.end_after_seal("run-1", child).await;
    let secrets = sb.secrets(&[CONNECTOR.1]);
    let run = sb.coordinator.run("run-1").unwrap();
    let events = serde_json::to_string(&run.events).unwrap();
    assert_no_secret("events", &events, &secrets);
    assert_no_secret("runner output (trace level)", &output, &secrets);
    let texts: Vec<String> = run
        .events
        .iter()
        .filter_map(|e| e.data["text"].as_str().map(str::to_string))
        .collect();
    for expected in [
        "whole: [REDACTED]",
        "split: [REDACTED]",
        "key=[REDACTED]",
        "bearer: [REDACTED]",
    ] {
        assert!(
            texts.iter().any(|t| t == expected),
            "{expected} not in {texts:?}"
        );
    }
    // Every request body the coordinator recorded is clean too.
    let bodies: String = sb
        .coordinator
        .requests()
        .iter()
        .map(|r| r.body.to_string())
        .collect();
    assert_no_secret("request bodies", &bodies, &secrets[1..]);
}

#[tokio::test]
async fn the_agent_pushes_through_the_credential_helper() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
echo change > CHANGE.md
git add CHANGE.md
git commit -q -m "agent change"
git push -q origin HEAD 2>&1
git rev-parse HEAD > "$AGENT_OUT/head"
"#,
    );
    let child = sb.spawn(&script);
    sb.end_after_seal("run-1", child).await;
    assert_eq!(sb.coordinator.run("run-1").unwrap().status, "succeeded");
    let remote = std::process::Command::new("git")
        .arg("-C")
        .arg(sb.coordinator.bare_repo())
        .args(["rev-parse", &sb.coordinator.branch()])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&remote.stdout).trim(),
        sb.read_out("head").trim()
    );
    let author = std::process::Command::new("git")
        .arg("-C")
        .arg(sb.coordinator.bare_repo())
        .args(["log", "-1", "--format=%an <%ae>", &sb.coordinator.branch()])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&author.stdout).trim(),
        "hosted-boot agent <agent@hosted-boot.invalid>"
    );
}

#[tokio::test]
async fn sigterm_mid_turn_seals_interrupted_and_exits_143() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
record_group > "$AGENT_OUT/pgid"
echo '{"type":"message","text":"working"}'
sleep 1000
"#,
    );
    let child = sb.spawn(&script);
    sb.wait_event("run-1", "message", |e| e.kind == "message")
        .await;
    signal(child.id().unwrap(), rustix::process::Signal::TERM);
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(143), "{output}");
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.run("run-1").unwrap().status, "interrupted");
    assert_eq!(snap.status_names(), vec!["turn_started", "turn_completed"]);
    let group = sb.read_group("pgid");
    assert_eq!(group.live_members(), Vec::<i32>::new());
    assert!(!sb.session_dir().exists());
}

#[tokio::test]
async fn sigterm_between_turns_exits_without_posting() {
    let sb = Sandbox::start(CoordinatorOptions {
        start_idle: true,
        ..CoordinatorOptions::default()
    })
    .await;
    let child = sb.spawn(&sb.script(OBSERVER));
    sb.coordinator
        .wait_for(WAIT, |s| s.status_names() == vec!["ready"])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    signal(child.id().unwrap(), rustix::process::Signal::INT);
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(130), "{output}");
    assert_eq!(sb.coordinator.snapshot().status_names(), vec!["ready"]);
    assert!(!sb.session_dir().exists());
}

/// The compat bodies the runner sends, checked against literal JSON written
/// from PROTOCOL.md 2.1, 2.2 and 2.6 (not through the shared wire types).
#[tokio::test]
async fn compat_bodies_match_the_contract_literally() {
    let sb = Sandbox::start(CoordinatorOptions {
        start_idle: true,
        ..CoordinatorOptions::default()
    })
    .await;
    let child = sb.spawn(&sb.script(OBSERVER));
    sb.coordinator
        .wait_for(WAIT, |s| s.status_names() == vec!["ready"])
        .await
        .unwrap();
    let run_id = sb.coordinator.queue_turn("go", None);
    sb.end_after_seal(&run_id, child).await;
    let requests = sb.coordinator.requests();
    let token = &requests[0];
    assert_eq!(
        (token.method.as_str(), token.path.as_str()),
        ("GET", "/api/cli/sessions/s1/agent-token")
    );
    assert_eq!(token.header("authorization"), Some("Bearer ***"));
    let bodies: Vec<(String, serde_json::Value)> = requests
        .iter()
        .filter(|r| {
            matches!(
                r.route,
                Target::Route(Route::BootStatus) | Target::Route(Route::RunStarted)
            )
        })
        .map(|r| (format!("{} {}", r.method, r.path), r.body.clone()))
        .collect();
    let status =
        |body: serde_json::Value| ("POST /api/cli/sessions/s1/boot-status".to_string(), body);
    assert_eq!(
        bodies,
        vec![
            status(json!({"status": "ready"})),
            status(json!({"status": "turn_started", "runId": "run-1"})),
            ("POST /api/cli/workbench-runs/run-1".to_string(), json!({})),
            status(json!({"status": "turn_completed", "runId": "run-1"})),
            status(json!({"status": "complete", "runId": null})),
        ]
    );
    let finish_body = requests.iter().find(|r| r.route == Route::Finish).unwrap();
    let branch = sb.coordinator.branch();
    let tip = remote_tip(&sb, &branch);
    // finish.resources (an extension): measured, its figures this
    // machine's; the compat fields are literal.
    let mut body = finish_body.body.clone();
    assert!(body.as_object_mut().unwrap().remove("resources").is_some());
    assert_eq!(
        body,
        json!({"status": "succeeded", "agentSessionId": null, "error": null, "usage": null,
               "result": {"name": "run-1", "branch": branch, "headSha": tip, "pushed": true,
                          "commits": 0, "filesChanged": 0, "insertions": 0, "deletions": 0}})
    );
    assert!(
        requests
            .iter()
            .filter(|r| r.route != Target::Dev)
            .all(|r| r.header("authorization").is_some())
    );
}

fn sigterm(child: &tokio::process::Child) {
    signal(child.id().unwrap(), rustix::process::Signal::TERM);
}

#[tokio::test]
async fn a_stop_while_turn_started_is_retried_posts_nothing_more() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    sb.coordinator
        .add_fault(Fault::delay(Route::BootStatus, Duration::from_secs(20)).times(20))
        .unwrap();
    let child = sb.spawn(&sb.script(OBSERVER));
    sb.coordinator
        .wait_for(WAIT, |s| {
            s.requests.iter().any(|r| r.route == Route::BootStatus)
        })
        .await
        .unwrap();
    sigterm(&child);
    let started = std::time::Instant::now();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(143), "{output}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the stop waited for the retries"
    );
    let snap = sb.coordinator.snapshot();
    let posted: Vec<&serde_json::Value> = snap
        .requests
        .iter()
        .filter(|r| r.route == Route::BootStatus)
        .map(|r| &r.body["status"])
        .collect();
    assert_eq!(posted, vec!["turn_started"], "posted after the stop");
    assert!(!snap.requests.iter().any(|r| r.route == Route::Finish));
    assert_eq!(sb.read_out("env-run-1"), "", "the agent was started");
    assert!(!sb.session_dir().exists());
    assert!(!sb.root().join(".orizu-run/run-1").exists());
}

#[tokio::test]
async fn the_stop_budget_bounds_a_seal_in_progress() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    // Every finish hangs past its 2 s attempt timeout: sealing retries for
    // 10 s and more, unless a stop's budget cuts it short.
    sb.coordinator
        .add_fault(Fault::delay(Route::Finish, Duration::from_secs(20)).times(20))
        .unwrap();
    let mut cmd = sb.runner(&sb.script("echo done"));
    cmd.env("HOSTED_BOOT_STOP_BUDGET", "25s");
    let child = cmd.spawn().unwrap();
    sb.coordinator
        .wait_for(WAIT, |s| {
            s.requests.iter().any(|r| r.route == Route::Finish)
        })
        .await
        .unwrap();
    sigterm(&child);
    let started = std::time::Instant::now();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(143), "{output}");
    // Scaled by 0.05 the budget is 1.25 s; without it the retries take >10 s.
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "the stop budget was not applied: {:?}",
        started.elapsed()
    );
    let names = sb.coordinator.snapshot().status_names();
    assert!(!names.contains(&"turn_failed"), "{names:?}");
    assert!(!sb.session_dir().exists());
}

// ---------------------------------------------------------------------------
// Body caps per route (PROTOCOL.md section 2, "Body caps").

/// The session read's cap (PROTOCOL.md section 2): 64 MiB.
const SESSION_CAP: u64 = 64 * 1024 * 1024;

/// An agent that records the size of the prompt it read on stdin.
const PROMPT_SIZER: &str = r#"
wc -c | tr -d ' ' > "$AGENT_OUT/prompt-size-$ORIZU_RUN_ID"
echo '{"type":"message","text":"read it"}'
"#;

/// Text shaped like pasted logs (lines, quotes, backslashes, non-ASCII), of
/// exactly `bytes` bytes.
fn pasted_logs(bytes: usize) -> String {
    let line = "2024-05-01T12:00:00Z ERROR worker \"job-42\" failed: C:\\tmp\\x — retrying\n";
    let mut text = line.repeat(bytes / line.len() + 1);
    while text.len() > bytes {
        text.pop();
    }
    text
}

/// Every integer written in `text`.
fn integers(text: &str) -> Vec<u64> {
    text.split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect()
}

#[tokio::test]
async fn a_queued_turn_with_a_5_mib_prompt_runs() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let child = sb.spawn(&sb.script(PROMPT_SIZER));
    sb.wait_sealed("run-1").await;
    let prompt = pasted_logs(5 * 1024 * 1024);
    let run_id = sb.coordinator.queue_turn(&prompt, None);
    let snap = sb.wait_sealed(&run_id).await;
    assert_eq!(snap.run(&run_id).unwrap().status, "succeeded");
    sb.coordinator.end_session();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(0), "{}", tail(&output));
    assert_eq!(
        sb.read_out(&format!("prompt-size-{run_id}")).trim(),
        prompt.len().to_string(),
        "the agent did not get the whole prompt"
    );
}

#[tokio::test]
async fn a_session_over_its_cap_between_turns_fails_the_boot_naming_size_and_cap() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let child = sb.spawn(&sb.script(PROMPT_SIZER));
    sb.wait_sealed("run-1").await;
    sb.coordinator
        .wait_for(WAIT, |s| s.status_names().contains(&"turn_completed"))
        .await
        .unwrap();
    // A queued turn whose prompt makes the session answer pass the cap. The
    // padding stands for the prompt: a debug build of the coordinator takes
    // longer than the request timeout to serialize a 64 MiB string.
    sb.coordinator
        .add_fault(Fault::pad(Route::Session, SESSION_CAP).times(1000))
        .unwrap();
    let run_id = sb
        .coordinator
        .queue_turn("a prompt with 64 MiB of logs", None);
    let queued = std::time::Instant::now();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(1), "{}", tail(&output));
    assert!(
        queued.elapsed() < Duration::from_secs(15),
        "the boot took {:?} to give up",
        queued.elapsed()
    );
    let snap = sb.coordinator.snapshot();
    // `failed`, not `turn_failed`: the run was never read, so it is not
    // sealed, and the last run was sealed and acknowledged already.
    assert_eq!(
        snap.status_names(),
        vec!["turn_started", "turn_completed", "failed"]
    );
    assert!(snap.run(&run_id).unwrap().finish.is_none());
    let failed = snap.statuses.last().unwrap();
    assert_eq!(failed.run_id, Some(None));
    let reason = failed.reason.as_deref().unwrap();
    assert!(reason.starts_with("session_too_large: "), "{reason}");
    let numbers = integers(reason);
    assert!(numbers.contains(&SESSION_CAP), "no cap in {reason}");
    assert!(
        numbers.iter().any(|n| *n > SESSION_CAP),
        "no size in {reason}"
    );
    // One read was enough: it is not retried as if transient.
    let over_cap_reads = snap
        .requests
        .iter()
        .filter(|r| r.route == Route::Session && r.fault.is_some())
        .count();
    assert_eq!(over_cap_reads, 1);
    assert!(!sb.session_dir().exists());
}

#[tokio::test]
async fn a_session_over_its_cap_at_boot_fails_the_boot_with_its_code() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    sb.coordinator
        .add_fault(Fault::pad(Route::Session, SESSION_CAP).times(5))
        .unwrap();
    let (status, output) = finish(sb.spawn(&sb.script(PROMPT_SIZER))).await;
    assert_eq!(status.code(), Some(1), "{}", tail(&output));
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.status_names(), vec!["failed"]);
    let reason = snap.statuses[0].reason.as_deref().unwrap();
    assert!(reason.starts_with("session_too_large: "), "{reason}");
    assert!(integers(reason).contains(&SESSION_CAP), "{reason}");
    let reads = snap
        .requests
        .iter()
        .filter(|r| r.route == Route::Session)
        .count();
    assert_eq!(reads, 1, "an answer over the cap is a verdict, not retried");
    assert!(!snap.requests.iter().any(|r| r.route == Target::Git));
}

#[tokio::test]
async fn an_over_cap_session_read_during_a_turn_is_logged_once_and_the_turn_goes_on() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
cat > /dev/null
touch "$AGENT_OUT/started"
while [ ! -e "$AGENT_OUT/go" ]; do sleep 0.05; done
echo '{"type":"message","text":"done"}'
"#,
    );
    let child = sb.spawn(&script);
    let started = sb.out().join("started");
    tokio::time::timeout(WAIT, async {
        while !started.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    sb.coordinator
        .add_fault(Fault::pad(Route::Session, SESSION_CAP).times(3))
        .unwrap();
    sb.coordinator
        .wait_for(WAIT, |s| {
            !s.faults.iter().any(|f| f.route == Route::Session)
                && s.requests.iter().any(|r| {
                    r.route == Route::Session && r.fault.is_some() && r.response_status.is_some()
                })
        })
        .await
        .unwrap();
    std::fs::write(sb.out().join("go"), "").unwrap();
    let snap = sb.wait_sealed("run-1").await;
    assert_eq!(snap.run("run-1").unwrap().status, "succeeded");
    let over_cap_reads: Vec<_> = snap
        .requests
        .iter()
        .filter(|r| r.route == Route::Session && r.fault.is_some())
        .collect();
    assert_eq!(over_cap_reads.len(), 3);
    assert!(
        over_cap_reads
            .iter()
            .all(|r| r.header("x-orizu-hosted-poll") == Some("during-turn")),
        "the over-cap answers went to the interrupt watch"
    );
    sb.coordinator.end_session();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(0), "{}", tail(&output));
    let watch_warnings: Vec<&str> = output
        .lines()
        .filter(|l| l.contains("\"WARN\"") && l.contains("interrupt watch"))
        .collect();
    assert_eq!(watch_warnings.len(), 1, "{watch_warnings:#?}");
    assert!(
        integers(watch_warnings[0]).contains(&SESSION_CAP),
        "{}",
        watch_warnings[0]
    );
}

/// The last lines of a runner's output (a failing assertion shows them, not
/// megabytes).
fn tail(output: &str) -> String {
    let lines: Vec<&str> = output.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

// ---------------------------------------------------------------------------
// The clone under the retry rule (PROTOCOL.md section 2, the clone row).

/// The git requests the coordinator saw: (method, path, status answered).
fn git_requests(snap: &Snapshot) -> Vec<(String, String, Option<u16>)> {
    snap.requests
        .iter()
        .filter(|r| r.route == Target::Git)
        .map(|r| (r.method.clone(), r.path.clone(), r.response_status))
        .collect()
}

/// What a git request of the clone is: the upload-pack `advertisement`, the
/// `fetch` (upload-pack POST), or `other` (the harvest's push).
fn kind(method: &str, path: &str) -> &'static str {
    match (method, path) {
        ("GET", p) if p.ends_with("/info/refs?service=git-upload-pack") => "advertisement",
        ("POST", p) if p.ends_with("/git-upload-pack") => "fetch",
        _ => "other",
    }
}

#[tokio::test]
async fn the_clone_is_retried_after_a_503_and_a_reset() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    sb.coordinator
        .add_fault(Fault::status(Target::Git, 503))
        .unwrap();
    sb.coordinator.add_fault(Fault::reset(Target::Git)).unwrap();
    let child = sb.spawn(&sb.script(OBSERVER));
    let snap = sb.wait_sealed("run-1").await;
    assert_eq!(snap.run("run-1").unwrap().status, "succeeded");
    sb.coordinator.end_session();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(0), "{}", tail(&output));
    let git = git_requests(&sb.coordinator.snapshot());
    let clone: Vec<(&str, Option<u16>)> =
        git[..4].iter().map(|(m, p, s)| (kind(m, p), *s)).collect();
    assert_eq!(
        clone,
        vec![
            ("advertisement", Some(503)),
            ("advertisement", None),
            ("advertisement", Some(200)),
            ("fetch", Some(200)),
        ],
        "{git:?}"
    );
    assert_eq!(
        sb.read_out("cwd-run-1").trim(),
        sb.root().join("repo").display().to_string()
    );
    assert!(sb.root().join("repo/README.md").exists());
}

#[tokio::test]
async fn a_clone_failing_on_every_attempt_fails_the_boot_after_exactly_four() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    sb.coordinator
        .add_fault(Fault::status(Target::Git, 503).times(50))
        .unwrap();
    let (status, output) = finish(sb.spawn(&sb.script(OBSERVER))).await;
    assert_eq!(status.code(), Some(1), "{}", tail(&output));
    let snap = sb.coordinator.snapshot();
    assert_eq!(git_requests(&snap).len(), 4, "{:?}", git_requests(&snap));
    assert_eq!(snap.status_names(), vec!["failed"]);
    let reason = snap.statuses[0].reason.as_deref().unwrap();
    assert!(
        reason.starts_with("clone_failed: the clone of "),
        "{reason}"
    );
    assert!(reason.contains("4 attempts"), "{reason}");
    assert!(reason.contains("503"), "{reason}");
    // Never a partial clone: nothing is left of the attempts.
    assert!(!sb.root().join("repo").exists(), "a partial clone was left");
}

#[tokio::test]
async fn a_refused_clone_is_a_verdict_not_retried() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    sb.coordinator
        .add_fault(Fault::status(Target::Git, 403).times(10))
        .unwrap();
    let (status, output) = finish(sb.spawn(&sb.script(OBSERVER))).await;
    assert_eq!(status.code(), Some(1), "{}", tail(&output));
    let snap = sb.coordinator.snapshot();
    assert_eq!(git_requests(&snap).len(), 1, "{:?}", git_requests(&snap));
    assert_eq!(snap.status_names(), vec!["failed"]);
    let reason = snap.statuses[0].reason.as_deref().unwrap();
    assert!(reason.starts_with("clone_failed: "), "{reason}");
    assert!(!sb.root().join("repo").exists());
}

#[tokio::test]
async fn a_repo_dir_that_is_no_clone_of_the_session_fails_the_boot_with_repo_conflict() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let repo = sb.root().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::write(repo.join("notes.txt"), "mine\n").unwrap();
    let (status, output) = finish(sb.spawn(&sb.script(OBSERVER))).await;
    assert_eq!(status.code(), Some(1), "{}", tail(&output));
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.status_names(), vec!["failed"]);
    let reason = snap.statuses[0].reason.as_deref().unwrap();
    assert!(reason.starts_with("repo_conflict: "), "{reason}");
    assert!(reason.contains(&repo.display().to_string()), "{reason}");
    // Refused, never cloned over.
    assert!(git_requests(&snap).is_empty(), "{:?}", git_requests(&snap));
    assert_eq!(
        std::fs::read_to_string(repo.join("notes.txt")).unwrap(),
        "mine\n"
    );
}

#[tokio::test]
async fn a_stalled_clone_transfer_is_aborted_and_retried() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    // The runner's stall bound is 30 s, scaled, never below 2 s (PROTOCOL.md
    // section 7); this stall outlasts it.
    sb.coordinator
        .add_fault(Fault::stall(Target::Git, Duration::from_secs(5)))
        .unwrap();
    let child = sb.spawn(&sb.script(OBSERVER));
    let snap = sb.wait_sealed("run-1").await;
    assert_eq!(snap.run("run-1").unwrap().status, "succeeded");
    sb.coordinator.end_session();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(0), "{}", tail(&output));
    let snap = sb.coordinator.snapshot();
    // What the contract says (PROTOCOL.md section 2, the clone row): the
    // stalled transfer (the first git request, the only one faulted) is
    // abandoned and the clone starts over with a fresh advertisement,
    // which a fetch follows. What later git requests do (the harvest's) is
    // no part of it.
    let git: Vec<(&str, bool)> = snap
        .requests
        .iter()
        .filter(|r| r.route == Target::Git)
        .map(|r| (kind(&r.method, &r.path), r.fault.is_some()))
        .collect();
    assert_eq!(
        git.iter().filter(|(_, faulted)| *faulted).count(),
        1,
        "{:?}",
        git_requests(&snap)
    );
    assert_eq!(
        git.get(..2),
        Some(&[("advertisement", true), ("advertisement", false)][..]),
        "{:?}",
        git_requests(&snap)
    );
    assert!(
        git[2..].iter().any(|(k, _)| *k == "fetch"),
        "{:?}",
        git_requests(&snap)
    );
    assert!(output.contains("stalled"), "{}", tail(&output));
}

/// Issue 38: `turn.json` at the fixed path `ORIZU_TURN_FILE` holds what only
/// the turn knows (run id, ordinal, task and instructions files, the
/// deadline of `durationMinutes`), the same values as the cold start's
/// variables; it is replaced at each turn's start and absent between turns
/// and after the boot.
#[tokio::test]
async fn the_turn_file_holds_what_only_the_turn_knows_and_only_during_it() {
    let sb = Sandbox::start(CoordinatorOptions {
        duration_minutes: Some(30.0),
        ..CoordinatorOptions::default()
    })
    .await;
    let script = sb.script(
        r#"
cp "$ORIZU_TURN_FILE" "$AGENT_OUT/turn-$ORIZU_RUN_ID"
printf '%s\n%s\n%s\n' "$ORIZU_TURN_FILE" "$ORIZU_TURN_DEADLINE" "$ORIZU_TASK_FILE" > "$AGENT_OUT/vars-$ORIZU_RUN_ID"
stat -c %a "$ORIZU_TURN_FILE" > "$AGENT_OUT/mode-$ORIZU_RUN_ID"
echo done
"#,
    );
    let child = sb.spawn(&script);
    sb.wait_sealed("run-1").await;
    let path = sb.session_dir().join("turn.json");
    assert!(!path.exists(), "the turn file outlived its turn");
    let next = sb.coordinator.queue_turn("And now?", None);
    sb.end_after_seal(&next, child).await;
    assert!(!path.exists(), "the turn file outlived the boot");
    for (run, ordinal) in [("run-1", 1), (next.as_str(), 2)] {
        let turn: serde_json::Value = serde_json::from_str(&sb.read_out(&format!("turn-{run}")))
            .unwrap_or_else(|e| panic!("{run}'s turn file: {e}"));
        let vars = sb.read_out(&format!("vars-{run}"));
        let vars: Vec<&str> = vars.lines().collect();
        assert_eq!(vars[0], path.to_str().unwrap(), "the path is the boot's");
        assert_eq!(turn["runId"], run);
        assert_eq!(turn["ordinal"], ordinal);
        assert_eq!(turn["taskFile"], vars[2]);
        assert_eq!(turn["instructionsFile"], serde_json::Value::Null);
        assert_eq!(turn["deadline"], vars[1], "{turn}");
        let deadline = humantime::parse_rfc3339(vars[1])
            .unwrap_or_else(|e| panic!("{run}'s deadline {:?}: {e}", vars[1]));
        let left = deadline
            .duration_since(std::time::SystemTime::now())
            .unwrap_or_default();
        // 30 minutes scaled by the suite's time scale, from the turn's
        // start, in whole seconds.
        assert!(left > Duration::ZERO, "{run}: {deadline:?}");
        assert_eq!(sb.read_out(&format!("mode-{run}")).trim(), "600");
    }
}

/// The review of issue 45: an https:// git base URL whose server speaks
/// plain HTTP was retried as a transient failure (four attempts, seconds of
/// backoff) and ended in rustls's words. It is a configuration error at the
/// first attempt, saying what to change, as for the coordinator's URLs.
#[tokio::test]
async fn an_https_git_base_answered_in_plain_http_fails_the_clone_at_once() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let base = sb
        .coordinator
        .git_base_url()
        .replacen("http://", "https://", 1);
    let mut cmd = sb.runner(&sb.script(OBSERVER));
    cmd.env("HOSTED_BOOT_GIT_BASE_URL", &base);
    let (status, output) = finish(cmd.spawn().unwrap()).await;
    assert_eq!(status.code(), Some(1), "{output}");
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.status_names(), vec!["failed"], "{output}");
    let reason = snap.statuses[0].reason.clone().unwrap();
    assert!(
        reason.starts_with("clone_failed: ")
            && reason.contains("answered the TLS handshake in plain HTTP")
            && reason.contains("HOSTED_BOOT_GIT_BASE_URL"),
        "{reason}"
    );
    assert!(!reason.contains("attempts"), "retried: {reason}");
}
