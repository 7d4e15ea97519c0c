//! The agent's API (PROTOCOL.md section 3, "The agent's API"): with the
//! agent API proxy (the default) the agent reads its session through the
//! runner with a per-turn proxy token and reaches nothing else; with
//! `--agent-api bearer` it holds the bearer and calls the coordinator, as
//! before.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use hosted_boot_coordinator::{CoordinatorOptions, Fault, Route, Target};
use serde_json::{Value, json};

use super::support::{Runner, Sandbox, assert_no_secret, finish, wait_for_file};

/// The header every request of the test agents carries: a request the
/// coordinator records with it came from the agent (through the proxy,
/// which forwards the contract's headers, trace context among them, or
/// directly). The runner sends no trace context of its own.
const MARK: &str = "tracestate";

/// Python for the agent scripts: `call(method, path, body, auth)` against
/// `ORIZU_API_BASE_URL` with the token of `ORIZU_TOKEN_FILE`, returning
/// `{"status", "body"}`; `save(name, value)` writes JSON to `$AGENT_OUT`.
const PRELUDE: &str = r#"
import json, os, sys, time, urllib.request, urllib.error
base = os.environ["ORIZU_API_BASE_URL"]
sid = os.environ["ORIZU_SESSION_ID"]
run = os.environ["ORIZU_RUN_ID"]
out = os.environ["AGENT_OUT"]
token = open(os.environ["ORIZU_TOKEN_FILE"]).read().strip()
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

def call(method, path, body=None, auth=token, url=None, headers=None, timeout=20):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request((url or base) + path, data=data, method=method)
    if auth is not None:
        req.add_header("Authorization", "Bearer " + auth)
    req.add_header("tracestate", "hbtest=agent")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with opener.open(req, timeout=timeout) as r:
            return {"status": r.status, "body": r.read().decode(),
                    "headers": {k.lower(): v for k, v in r.headers.items()}}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": e.read().decode(),
                "headers": {k.lower(): v for k, v in e.headers.items()}}

def save(name, value):
    # Whole or absent: the test waits for the name, then reads it.
    tmp = os.path.join(out, "." + name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.rename(tmp, os.path.join(out, name))

def wait_go():
    while not os.path.exists(os.path.join(out, "go")):
        time.sleep(0.02)
"#;

/// An agent script running `body` (Python, after [`PRELUDE`]).
fn python_agent(sb: &Sandbox, body: &str) -> std::path::PathBuf {
    sb.script(&format!(
        "/usr/bin/env python3 - <<'PY'\n{PRELUDE}\n{body}\nPY\n"
    ))
}

fn read_json(sb: &Sandbox, name: &str) -> Value {
    serde_json::from_str(&sb.read_out(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A bearer pulled by the test with the boot secret.
async fn test_bearer(sb: &Sandbox) -> String {
    let resp = reqwest::Client::new()
        .get(sb.coordinator.agent_token_url())
        .bearer_auth(sb.coordinator.boot_secret())
        .send()
        .await
        .unwrap();
    let body: Value = resp.json().await.unwrap();
    body["token"].as_str().unwrap().to_string()
}

/// The routes of the coordinator's request record that carried [`MARK`].
fn marked_routes(sb: &Sandbox) -> Vec<Target> {
    sb.coordinator
        .requests()
        .iter()
        .filter(|r| r.header(MARK).is_some())
        .map(|r| r.route)
        .collect()
}

const REFUSALS: &str = r#"
calls = {
    "session": call("GET", f"api/cli/sessions/{sid}"),
    "agent-token": call("GET", f"api/cli/sessions/{sid}/agent-token"),
    "boot-status": call("POST", f"api/cli/sessions/{sid}/boot-status",
                        {"status": "failed", "runId": None, "reason": "forged"}),
    "env-bundle": call("GET", f"api/cli/sessions/{sid}/env-bundle"),
    "repo-token": call("POST", f"api/cli/sessions/{sid}/repo-token", {"access": "write"}),
    "run-started": call("POST", f"api/cli/workbench-runs/{run}", {}),
    "events": call("POST", f"api/cli/workbench-runs/{run}/events",
                   {"events": [{"seq": 1, "type": "forged", "at": "2026-01-01T00:00:00Z", "data": {}}]}),
    "finish": call("POST", f"api/cli/workbench-runs/{run}/finish",
                   {"status": "succeeded", "agentSessionId": None, "error": None, "usage": None, "result": None}),
    "cursor": call("GET", f"api/cli/workbench-runs/{run}/events/cursor"),
    "other-session": call("GET", "api/cli/sessions/another-session"),
    "wrong-method": call("POST", f"api/cli/sessions/{sid}", {}),
    "unknown-path": call("GET", f"api/cli/sessions/{sid}/nothing"),
    "dev-api": call("GET", "dev/state"),
    "no-token": call("GET", f"api/cli/sessions/{sid}", auth=None),
    "wrong-token": call("GET", f"api/cli/sessions/{sid}", auth="0" * 64),
}
save("calls.json", calls)
wait_go()
"#;

#[tokio::test]
async fn through_the_proxy_the_agent_reads_its_session_and_nothing_else() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = python_agent(&sb, REFUSALS);
    let runner = Runner::spawn(&sb, &script);
    wait_for_file(&sb.out().join("calls.json")).await;
    let calls = read_json(&sb, "calls.json");

    // The session read: what the coordinator answers, byte for byte the
    // same JSON (the turn waits, so the session does not change meanwhile).
    let direct = reqwest::Client::new()
        .get(format!(
            "{}api/cli/sessions/{}",
            sb.coordinator.base_url(),
            sb.coordinator.session_id()
        ))
        .bearer_auth(test_bearer(&sb).await)
        .send()
        .await
        .unwrap();
    assert_eq!(direct.status(), 200);
    let direct: Value = direct.json().await.unwrap();
    assert_eq!(calls["session"]["status"], 200, "{calls}");
    let through: Value = serde_json::from_str(calls["session"]["body"].as_str().unwrap()).unwrap();
    assert_eq!(through, direct);

    let expected = [
        ("agent-token", 403, "never_forwarded", json!("agent-token")),
        ("boot-status", 403, "never_forwarded", json!("boot-status")),
        ("env-bundle", 403, "never_forwarded", json!("env-bundle")),
        ("repo-token", 403, "never_forwarded", json!("repo-token")),
        ("run-started", 403, "not_allowed", json!("run-started")),
        ("events", 403, "not_allowed", json!("events")),
        ("finish", 403, "not_allowed", json!("finish")),
        ("cursor", 403, "not_allowed", json!("cursor")),
        ("other-session", 403, "other_session", json!("session")),
        ("wrong-method", 403, "unknown_route", json!("session")),
        ("unknown-path", 403, "unknown_route", json!(null)),
        ("dev-api", 403, "unknown_route", json!(null)),
        ("no-token", 401, "unauthenticated", json!(null)),
        ("wrong-token", 401, "unauthenticated", json!(null)),
    ];
    for (name, status, refusal, route) in expected.iter().cloned() {
        let call = &calls[name];
        assert_eq!(call["status"], status, "{name}: {call}");
        let body: Value = serde_json::from_str(call["body"].as_str().unwrap())
            .unwrap_or_else(|e| panic!("{name}: the refusal is not JSON ({e}): {call}"));
        assert_eq!(body["refusal"], refusal, "{name}: {body}");
        assert_eq!(body["route"], route, "{name}: {body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("the agent API proxy refuses")),
            "{name}: {body}"
        );
    }
    // Of everything the agent sent, only the session read reached the
    // coordinator (the control: a forwarded request is seen with the mark).
    assert_eq!(marked_routes(&sb), vec![Route::Session]);

    std::fs::write(sb.out().join("go"), "").unwrap();
    let snap = sb.wait_sealed("run-1").await;
    assert_eq!(snap.run("run-1").unwrap().status, "succeeded");
    assert!(
        snap.run("run-1")
            .unwrap()
            .events
            .iter()
            .all(|e| e.kind != "forged"),
        "a forged event reached the run"
    );
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_eq!(marked_routes(&sb), vec![Route::Session]);
    // The runner logs each refusal, naming the route.
    let refused: Vec<&str> = output
        .lines()
        .filter(|l| l.contains("agent API proxy refused a request"))
        .collect();
    assert_eq!(refused.len(), expected.len(), "{refused:#?}");
    assert!(
        refused
            .iter()
            .any(|l| l.contains("agent-token") && l.contains("never_forwarded")),
        "{refused:#?}"
    );
}

#[tokio::test]
async fn the_proxy_token_stops_working_when_its_turn_ends() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = python_agent(
        &sb,
        r#"
if run == "run-1":
    open(os.path.join(out, "token-1"), "w").write(token)
    open(os.path.join(out, "base-1"), "w").write(base)
    print(json.dumps({"type": "message", "text": "token: " + token}), flush=True)
    save("calls-run-1.json", {"own": call("GET", f"api/cli/sessions/{sid}")})
else:
    old = open(os.path.join(out, "token-1")).read()
    save("calls-" + run + ".json", {
        "old": call("GET", f"api/cli/sessions/{sid}", auth=old),
        "own": call("GET", f"api/cli/sessions/{sid}"),
        "token": token,
        "same_base": base == open(os.path.join(out, "base-1")).read(),
    })
"#,
    );
    let runner = Runner::spawn(&sb, &script);
    sb.wait_sealed("run-1").await;
    let first = read_json(&sb, "calls-run-1.json");
    assert_eq!(first["own"]["status"], 200, "{first}");
    let token = sb.read_out("token-1");
    assert_eq!(token.len(), 64, "a proxy token is 32 random bytes, hex");
    assert!(!sb.coordinator.issued_secrets().contains(&token));
    // Printed by the agent: redacted like a bearer.
    sb.wait_text("run-1", "token: [REDACTED]").await;

    // Between turns the proxy still listens, and refuses the old token.
    let url = format!(
        "{}api/cli/sessions/{}",
        sb.read_out("base-1"),
        sb.coordinator.session_id()
    );
    let between = reqwest::Client::new()
        .get(&url)
        .bearer_auth(&token)
        .header(MARK, "hbtest=agent")
        .send()
        .await
        .unwrap();
    assert_eq!(between.status(), 401);
    let body: Value = between.json().await.unwrap();
    assert_eq!(body["refusal"], "unauthenticated", "{body}");

    let run_2 = sb.coordinator.queue_turn("second turn", None);
    sb.wait_sealed(&run_2).await;
    let second = read_json(&sb, &format!("calls-{run_2}.json"));
    assert_eq!(second["old"]["status"], 401, "{second}");
    assert_eq!(second["own"]["status"], 200, "{second}");
    assert_ne!(second["token"], json!(token));
    assert_eq!(second["same_base"], true, "one proxy per boot");
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_no_secret("runner output", &output, &[token]);
    // Only the two reads with a valid token reached the coordinator.
    assert_eq!(
        marked_routes(&sb),
        vec![Route::Session, Route::Session],
        "the refused reads must not be forwarded"
    );
}

/// Issue 32: a proxy token serves only the processes of its turn. Read
/// from the bearer file by a process outside the runner's tree (here the
/// test itself: a sidecar sharing the Pod's loopback, a `kubectl exec`
/// shell, a process that outlived an earlier turn), it is refused
/// `outside_turn` while the turn runs, and nothing reaches the coordinator;
/// the agent's own call with it goes through.
#[tokio::test]
async fn a_token_taken_by_a_process_outside_the_turn_is_refused() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = python_agent(
        &sb,
        r#"
import time
open(os.path.join(out, "token.tmp"), "w").write(token)
open(os.path.join(out, "base.tmp"), "w").write(base)
os.rename(os.path.join(out, "base.tmp"), os.path.join(out, "base"))
os.rename(os.path.join(out, "token.tmp"), os.path.join(out, "token"))
while not os.path.exists(os.path.join(out, "go")):
    time.sleep(0.01)
save("calls.json", {"own": call("GET", f"api/cli/sessions/{sid}")})
"#,
    );
    let runner = Runner::spawn(&sb, &script);
    let deadline = std::time::Instant::now() + super::support::WAIT;
    while !sb.out().join("token").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent did not start"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let token = sb.read_out("token");
    let url = format!(
        "{}api/cli/sessions/{}",
        sb.read_out("base"),
        sb.coordinator.session_id()
    );
    // Twice: a refused connection is not remembered as the turn's.
    for _ in 0..2 {
        let outside = reqwest::Client::new()
            .get(&url)
            .bearer_auth(&token)
            .header(MARK, "hbtest=agent")
            .send()
            .await
            .unwrap();
        assert_eq!(outside.status(), 403);
        let body: Value = outside.json().await.unwrap();
        assert_eq!(body["refusal"], "outside_turn", "{body}");
    }
    std::fs::write(sb.out().join("go"), "").unwrap();
    sb.wait_sealed("run-1").await;
    let calls = read_json(&sb, "calls.json");
    assert_eq!(calls["own"]["status"], 200, "{calls}");
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert!(
        output.contains("outside_turn"),
        "the refusal is logged: {output}"
    );
    assert_no_secret("runner output", &output, &[token]);
    assert_eq!(
        marked_routes(&sb),
        vec![Route::Session],
        "only the agent's own read reaches the coordinator"
    );
}

/// The coordinator's answer comes back as it gave it (status, body,
/// `Retry-After`); one over the route's cap by
/// its `Content-Length` is refused by the proxy.
#[tokio::test]
async fn the_proxy_passes_answers_through_under_the_routes_cap() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = python_agent(
        &sb,
        r#"
open(os.path.join(out, "started"), "w").write("")
for step in ["503", "padded"]:
    while not os.path.exists(os.path.join(out, "go-" + step)):
        time.sleep(0.02)
    save("call-" + step + ".json", call("GET", f"api/cli/sessions/{sid}"))
"#,
    );
    let runner = Runner::spawn(&sb, &script);
    // Not before the agent runs (the boot's own session read would meet
    // them). The interrupt watch reads the session too: the faults hold
    // for many reads, and go once the agent's read is done.
    wait_for_file(&sb.out().join("started")).await;
    let fault = |value: Value| -> Fault { serde_json::from_value(value).unwrap() };
    sb.coordinator
        .add_fault(fault(
            json!({"route": "session", "status": 503, "retryAfter": "7",
            "body": "{\"error\":\"arming\"}", "count": 1000}),
        ))
        .unwrap();
    std::fs::write(sb.out().join("go-503"), "").unwrap();
    wait_for_file(&sb.out().join("call-503.json")).await;
    sb.coordinator.clear_faults();
    let busy = read_json(&sb, "call-503.json");
    assert_eq!(busy["status"], 503, "{busy}");
    assert_eq!(busy["body"], "{\"error\":\"arming\"}", "{busy}");
    assert_eq!(busy["headers"]["retry-after"], "7", "{busy}");

    // 64 MiB is the session read's cap.
    sb.coordinator
        .add_fault(fault(
            json!({"route": "session", "padBytes": 65u64 * 1024 * 1024, "count": 1000}),
        ))
        .unwrap();
    std::fs::write(sb.out().join("go-padded"), "").unwrap();
    wait_for_file(&sb.out().join("call-padded.json")).await;
    sb.coordinator.clear_faults();
    let padded = read_json(&sb, "call-padded.json");
    assert_eq!(padded["status"], 502, "{padded}");
    assert!(
        padded["body"].as_str().unwrap().contains("upstream_failed")
            && padded["body"].as_str().unwrap().contains("cap"),
        "{padded}"
    );
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
}

#[tokio::test]
async fn agent_api_allow_adds_a_route() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = python_agent(
        &sb,
        r#"
save("calls.json", {
    "cursor": call("GET", f"api/cli/workbench-runs/{run}/events/cursor"),
    "other-run": call("GET", "api/cli/workbench-runs/run-9/events/cursor"),
    "finish": call("POST", f"api/cli/workbench-runs/{run}/finish", {"status": "succeeded"}),
})
"#,
    );
    let mut cmd = sb.runner(&script);
    cmd.env("HOSTED_BOOT_AGENT_API_ALLOW", "cursor");
    let runner = Runner::reading(cmd.spawn().unwrap());
    sb.wait_sealed("run-1").await;
    let calls = read_json(&sb, "calls.json");
    assert_eq!(calls["cursor"]["status"], 200, "{calls}");
    let cursor: Value = serde_json::from_str(calls["cursor"]["body"].as_str().unwrap()).unwrap();
    assert!(cursor["acceptedThrough"].is_u64(), "{cursor}");
    assert_eq!(calls["other-run"]["status"], 403, "{calls}");
    assert!(
        calls["other-run"]["body"]
            .as_str()
            .unwrap()
            .contains("other_run")
    );
    assert_eq!(calls["finish"]["status"], 403, "{calls}");
    assert_eq!(marked_routes(&sb), vec![Route::Cursor]);
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
}

#[tokio::test]
async fn agent_api_allow_refuses_unknown_and_credential_routes_at_start() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script("exit 0");
    for (value, expected) in [
        (
            "cursor,sessions",
            "session, run-started, events, cursor, finish",
        ),
        ("agent-token", "never forwards"),
        ("boot-status", "never forwards"),
        ("env-bundle", "never forwards"),
        ("repo-token", "never forwards"),
    ] {
        let mut cmd = sb.runner(&script);
        cmd.env("HOSTED_BOOT_AGENT_API_ALLOW", value);
        let (status, output) = finish(cmd.spawn().unwrap()).await;
        assert_eq!(status.code(), Some(2), "{value}: {output}");
        assert!(
            output.contains("--agent-api-allow") && output.contains(expected),
            "{value}: {output}"
        );
    }
    assert_eq!(sb.coordinator.requests().len(), 0);
}

/// The runner's `/proc/<pid>/environ` and `/proc/<pid>/mem` are closed to
/// its agent (non-dumpable, PROTOCOL.md 3); the agent's own are open (the
/// control). As root, the runner runs as uid 65534 (root reads any
/// process's memory).
#[tokio::test]
async fn the_agent_cannot_read_the_runners_environment_or_memory() {
    let root = rustix::process::getuid().is_root();
    if root && let Err(reason) = hosted_boot_test_support::program("/usr/bin/setpriv", "util-linux")
    {
        // As root, the runner runs as uid 65534 through setpriv.
        hosted_boot_test_support::skip(reason);
        return;
    }
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    if root {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(sb.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        for p in [sb.dir.path(), &sb.root(), &sb.out()] {
            std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
        }
    }
    let script = sb.script(
        r#"
echo $PPID > "$AGENT_OUT/ppid"
/usr/bin/python3 - "$PPID" <<'PY'
import json, os, sys
def environ(pid):
    try:
        return "read" if open(f"/proc/{pid}/environ", "rb").read() else "empty"
    except OSError as e:
        return type(e).__name__
def mem(pid):
    try:
        f = open(f"/proc/{pid}/mem", "rb")
    except OSError as e:
        return type(e).__name__
    # A mapped address, from this process's own maps when the target's
    # are closed too (the control reads its own).
    try:
        first = open(f"/proc/{pid}/maps").readline()
    except OSError:
        first = open("/proc/self/maps").readline()
    f.seek(int(first.split("-")[0], 16))
    try:
        return "read" if f.read(16) else "empty"
    except OSError as e:
        return type(e).__name__
runner = sys.argv[1]
json.dump({"runner_environ": environ(runner), "runner_mem": mem(runner),
           "own_environ": environ("self"), "own_mem": mem("self")},
          open(os.environ["AGENT_OUT"] + "/proc.json", "w"))
PY
"#,
    );
    let child = if root {
        let setpriv = [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
        ];
        sb.wrapped_command(&setpriv, "run", &script)
            .spawn()
            .unwrap()
    } else {
        sb.spawn(&script)
    };
    let runner_pid = child.id().unwrap();
    let (_, output) = sb.end_after_seal("run-1", child).await;
    assert_eq!(
        sb.read_out("ppid").trim(),
        runner_pid.to_string(),
        "{output}"
    );
    let seen = read_json(&sb, "proc.json");
    assert_eq!(seen["own_environ"], "read", "the control: {seen}");
    assert_eq!(seen["own_mem"], "read", "the control: {seen}");
    assert_eq!(seen["runner_environ"], "PermissionError", "{seen}");
    assert_eq!(seen["runner_mem"], "PermissionError", "{seen}");
}

/// Every regular file under `dir`, recursively (symbolic links not
/// followed).
fn files_under(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => files_under(&path, out),
            Ok(m) if m.is_file() => out.push(path),
            _ => {}
        }
    }
}

#[tokio::test]
async fn in_proxy_mode_no_bearer_is_in_the_agents_environment_or_files() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = python_agent(
        &sb,
        r#"
open(os.path.join(out, "env"), "w").write("\n".join(f"{k}={v}" for k, v in os.environ.items()))
open(os.path.join(out, "token"), "w").write(token)
ctx = json.load(open(os.path.join(os.path.dirname(os.environ["ORIZU_TOKEN_FILE"]), "boot-context.json")))
# What it finds on disk: the coordinator's own URLs, tried with the token.
save("direct.json", {
    "session": call("GET", f"api/cli/sessions/{sid}", url=ctx["apiBaseUrl"]),
    "agent-token": call("GET", "", url=ctx["agentTokenUrl"]),
})
open(os.path.join(out, "ready"), "w").write("")
wait_go()
"#,
    );
    let runner = Runner::spawn(&sb, &script);
    wait_for_file(&sb.out().join("ready")).await;
    // While the turn runs: every file under the root and the agent's
    // records (its environment among them).
    let bearers = sb.coordinator.issued_bearers();
    assert!(!bearers.is_empty());
    let mut files = Vec::new();
    files_under(&sb.root(), &mut files);
    files_under(&sb.out(), &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("bearer")),
        "the bearer file is scanned too: {files:?}"
    );
    for file in &files {
        let text = String::from_utf8_lossy(&std::fs::read(file).unwrap_or_default()).into_owned();
        assert_no_secret(&file.display().to_string(), &text, &bearers);
    }
    let env = sb.read_out("env");
    assert!(
        env.contains("ORIZU_API_BASE_URL=http://127.0.0.1:"),
        "{env}"
    );
    assert!(
        !env.contains(&format!("ORIZU_API_BASE_URL={}", sb.coordinator.base_url())),
        "{env}"
    );
    for withheld in [
        "ORIZU_AGENT_TOKEN_URL=",
        "ORIZU_BOOT_STATUS_URL=",
        "ORIZU_BOOT_SECRET=",
    ] {
        assert!(!env.contains(withheld), "{withheld} in {env}");
    }
    let token = sb.read_out("token");
    assert!(!bearers.contains(&token));
    let direct = read_json(&sb, "direct.json");
    assert_eq!(direct["session"]["status"], 401, "{direct}");
    assert_eq!(direct["agent-token"]["status"], 401, "{direct}");
    // The bearer file is 0600 and the runner's.
    let meta = std::fs::metadata(sb.session_dir().join("bearer")).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o600);

    std::fs::write(sb.out().join("go"), "").unwrap();
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
}

#[tokio::test]
async fn in_bearer_mode_the_agent_calls_the_coordinator_with_the_bearer() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = python_agent(
        &sb,
        r#"
save("calls.json", {
    "session": call("GET", f"api/cli/sessions/{sid}"),
    "base": base,
    "token": token,
    "agent_token_url": os.environ.get("ORIZU_AGENT_TOKEN_URL"),
})
"#,
    );
    let mut cmd = sb.runner(&script);
    cmd.env("HOSTED_BOOT_AGENT_API", "bearer");
    let (_, output) = sb.end_after_seal("run-1", cmd.spawn().unwrap()).await;
    let calls = read_json(&sb, "calls.json");
    assert_eq!(calls["session"]["status"], 200, "{calls}");
    let body: Value = serde_json::from_str(calls["session"]["body"].as_str().unwrap()).unwrap();
    assert!(body["session"]["repoBranch"].is_string(), "{body}");
    assert_eq!(calls["base"], sb.coordinator.base_url().as_str());
    assert!(
        sb.coordinator
            .issued_bearers()
            .contains(&calls["token"].as_str().unwrap().to_string()),
        "the bearer file did not hold a bearer"
    );
    // Today's contract: the runner's environment, injected URLs included.
    assert_eq!(calls["agent_token_url"], sb.coordinator.agent_token_url());
    assert_eq!(marked_routes(&sb), vec![Route::Session]);
    assert!(!output.contains("agent API proxy listening"), "{output}");
    assert_eq!(sb.coordinator.run("run-1").unwrap().status, "succeeded");
}

/// A coordinator behind middleware that honours the override headers
/// (IIS URL Rewrite's `X-Original-URL` and `X-Rewrite-URL`, the
/// `X-HTTP-Method-Override` of Symfony, Laravel and Express,
/// `X-Forwarded-Prefix`): a stand-in on loopback in front of the reference
/// coordinator that re-routes a request as they say, then forwards it.
async fn overriding_front(
    coordinator: reqwest::Url,
) -> (reqwest::Url, tokio::task::JoinHandle<()>) {
    use axum::body::Bytes;
    use axum::http::{HeaderMap, Method, Uri};
    let client = reqwest::Client::new();
    let front = move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
        let (client, coordinator) = (client.clone(), coordinator.clone());
        async move {
            let get = |name: &str| {
                headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            let mut path = uri.path().to_string();
            for name in ["x-original-url", "x-rewrite-url"] {
                if let Some(p) = get(name) {
                    path = p;
                }
            }
            if let Some(prefix) = get("x-forwarded-prefix") {
                path = format!("{}{path}", prefix.trim_end_matches('/'));
            }
            let method = get("x-http-method-override")
                .and_then(|m| Method::from_bytes(m.as_bytes()).ok())
                .unwrap_or(method);
            let url = coordinator.join(path.trim_start_matches('/')).unwrap();
            let mut request = client.request(method, url).body(body.to_vec());
            for (name, value) in &headers {
                if name != "host" && name != "content-length" {
                    request = request.header(name, value);
                }
            }
            let answer = request.send().await.unwrap();
            let status = answer.status();
            let body = answer.bytes().await.unwrap();
            (status, body)
        }
    };
    let app = axum::Router::new().fallback(front);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = reqwest::Url::parse(&format!("http://{}/", listener.local_addr().unwrap())).unwrap();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, task)
}

/// Issue 32, item 3: the proxy forwards only the contract's headers. With
/// a coordinator that honours override headers, an allowed session read
/// carrying them got the env bundle (a setup-only connector in it) and a
/// write repo token minted with the runner's bearer; now it stays a session
/// read, and no request of the agent reaches another route.
#[tokio::test]
async fn headers_that_re_route_requests_never_leave_the_proxy() {
    let sb = Sandbox::start(CoordinatorOptions {
        connectors: vec![("ACME_KEY".into(), "acme-connector-value-31".into())],
        ..CoordinatorOptions::default()
    })
    .await;
    let (front, _task) = overriding_front(sb.coordinator.base_url()).await;
    let script = python_agent(
        &sb,
        r#"
def call_with(headers):
    return call("GET", f"api/cli/sessions/{sid}", headers=headers)

bundle = f"/api/cli/sessions/{sid}/env-bundle"
token_path = f"/api/cli/sessions/{sid}/repo-token"
save("calls.json", {
    "original-url": call_with({"X-Original-URL": bundle}),
    "rewrite-url": call_with({"X-Rewrite-URL": bundle}),
    "method-override": call_with({"X-HTTP-Method-Override": "POST", "X-Original-URL": token_path}),
    "forwarded-prefix": call_with({"X-Forwarded-Prefix": "/api/cli/sessions/" + sid + "/env-bundle#"}),
    "forwarded": call_with({"Forwarded": "host=evil.invalid", "X-Forwarded-Host": "evil.invalid"}),
})
"#,
    );
    let mut cmd = sb.runner(&script);
    cmd.env("ORIZU_API_BASE_URL", front.as_str());
    let runner = Runner::reading(cmd.spawn().unwrap());
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    let calls = read_json(&sb, "calls.json");
    for (name, call) in calls.as_object().unwrap() {
        assert_eq!(call["status"], 200, "{name}: {call}");
        let body: Value = serde_json::from_str(call["body"].as_str().unwrap()).unwrap();
        assert!(body["session"].is_object(), "{name} was re-routed: {body}");
        assert!(
            !call["body"]
                .as_str()
                .unwrap()
                .contains("acme-connector-value-31"),
            "{name}"
        );
    }
    assert_eq!(marked_routes(&sb), vec![Route::Session; 5]);
}

/// Issue 32, item 3: the headers the long-poll needs still pass the proxy
/// both ways (`Prefer`, `If-None-Match`; `ETag`, `Preference-Applied`): an
/// agent's session read through it is held until the session changes.
#[tokio::test]
async fn the_agents_long_poll_is_held_through_the_proxy() {
    let sb = Sandbox::start(CoordinatorOptions {
        long_poll: true,
        ..CoordinatorOptions::default()
    })
    .await;
    let script = python_agent(
        &sb,
        r#"
def read(headers):
    return call("GET", f"api/cli/sessions/{sid}", headers=headers, timeout=60)

first = read({})
held = read({"Prefer": "wait=30", "If-None-Match": first["headers"].get("etag", "none")})
save("calls.json", {"first": first, "held": held})
"#,
    );
    let runner = Runner::spawn(&sb, &script);
    sb.coordinator
        .wait_for(super::support::WAIT, |s| {
            s.requests.iter().any(|r| {
                r.header(MARK).is_some()
                    && r.header("if-none-match").is_some()
                    && r.response_status.is_none()
            })
        })
        .await
        .unwrap();
    assert!(
        sb.read_out("calls.json").is_empty(),
        "answered before a change"
    );
    let next = sb.coordinator.queue_turn("More.", None);
    sb.wait_sealed("run-1").await;
    let calls = read_json(&sb, "calls.json");
    assert_eq!(calls["held"]["status"], 200, "{calls}");
    assert_eq!(
        calls["held"]["headers"]["preference-applied"], "wait=30",
        "{calls}"
    );
    assert_ne!(
        calls["held"]["headers"]["etag"],
        calls["first"]["headers"]["etag"]
    );
    let body: Value = serde_json::from_str(calls["held"]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["session"]["runs"][0]["id"], json!(next), "{body}");
    sb.coordinator.end_session();
    let _ = runner.kill().await;
}

/// Issue 32, item 4: a flood of connections to the proxy takes none of the
/// runner's file descriptors past the proxy's cap, and idle connections are
/// closed: the agent's own request is served once they are, and the
/// runner's work (the harvest's push, the seal) is unaffected. Before, 21,000
/// connections reached the runner's descriptor limit.
#[tokio::test]
async fn a_flood_of_connections_to_the_proxy_is_capped_and_timed_out() {
    const FLOOD: usize = 600;
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = python_agent(
        &sb,
        &format!(
            r#"
import resource, socket, urllib.parse
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
u = urllib.parse.urlparse(base)
held = []
for _ in range({FLOOD}):
    # Past the proxy's slots and the kernel's listen backlog a connect
    # times out: that is the cap.
    try:
        s = socket.create_connection((u.hostname, u.port), 1)
    except OSError:
        break
    held.append(s)
save("flooded", {{"connections": len(held)}})
while not os.path.exists(os.path.join(out, "counted")):
    time.sleep(0.05)
# Past the slots, the rest let go: the agent's own request waits only
# for the idle ones to be closed.
for s in held[40:]:
    s.close()
held = held[:40]
answer = call("GET", f"api/cli/sessions/{{sid}}")
closed = 0
for s in held:
    s.settimeout(0.01)
    try:
        if s.recv(1) == b"":
            closed += 1
    except OSError:
        closed += 1
save("answer.json", {{"status": answer["status"], "closed": closed}})
open("work.md", "w").write("work under a flood\n")
"#
        ),
    );
    let runner = Runner::spawn(&sb, &script);
    let runner_pid = runner.pid();
    wait_for_file(&sb.out().join("flooded")).await;
    let fds = std::fs::read_dir(format!("/proc/{runner_pid}/fd"))
        .unwrap()
        .count();
    std::fs::write(sb.out().join("counted"), "").unwrap();
    let snap = sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert!(
        fds < FLOOD / 2,
        "the runner holds {fds} descriptors under a flood of {FLOOD} connections"
    );
    let answer = read_json(&sb, "answer.json");
    assert_eq!(answer["status"], 200, "{answer}");
    assert!(
        answer["closed"].as_u64().unwrap() > 0,
        "no idle connection was closed: {answer}"
    );
    let finish = snap.run("run-1").unwrap().finish.as_ref().unwrap();
    let result = serde_json::to_value(&finish.result).unwrap();
    assert_eq!(result["pushed"], json!(true), "{result}");
    assert_eq!(
        sb.remote_file("work.md").as_deref(),
        Some("work under a flood\n")
    );
}
