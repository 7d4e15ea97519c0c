//! The edges of the `acp` adapter: a reviewer's probes, the real binary
//! driving a hostile or buggy ACP agent (`tests/fakes/acp-agent/agent.py
//! <scenario>`: stray answers, a refused load from an agent that never
//! exits, floods, huge ids, foreign sessions, spoofed event types, secrets
//! in every field), kept as regression tests; each states what is
//! promised.

use std::path::Path;
use std::time::{Duration, Instant};

use hosted_boot_coordinator::{CoordinatorOptions, Snapshot};
use serde_json::{Value, json};

use super::support::{Runner, Sandbox, agent_events};

const AGENT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fakes/acp-agent/agent.py"
);
pub(super) const SECRET: &str = "acme-s3cr3t-value-0123456789";

pub(super) fn python() -> String {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

pub(super) fn opts(task: &str) -> CoordinatorOptions {
    CoordinatorOptions {
        task: task.into(),
        connectors: vec![("ACME_TOKEN".into(), SECRET.into())],
        ..CoordinatorOptions::default()
    }
}

/// The runner driving a fake ACP agent's `scenario`; what the agent saw
/// is in its log (`$AGENT_OUT/acp-log.jsonl`).
pub(super) struct Probe {
    pub(super) sb: Sandbox,
    runner: Option<Runner>,
    started: Instant,
}

impl Probe {
    async fn start(
        scenario: &str,
        opts: CoordinatorOptions,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Probe {
        Probe::start_agent(AGENT, scenario, opts, args, env).await
    }

    /// As [`Probe::start`], with the fake agent at `agent` (a Python
    /// script taking the scenario as its argument).
    pub(super) async fn start_agent(
        agent: &str,
        scenario: &str,
        opts: CoordinatorOptions,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Probe {
        let sb = Sandbox::start(opts).await;
        let mut cmd = sb.command("run", Path::new("/nonexistent"));
        cmd.env("HOSTED_BOOT_AGENT", "acp")
            .env(
                "HOSTED_BOOT_AGENT_COMMAND",
                format!("{} {agent} {scenario}", python()),
            )
            .args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let runner = Runner::reading(cmd.spawn().unwrap());
        Probe {
            sb,
            runner: Some(runner),
            started: Instant::now(),
        }
    }

    /// The snapshot once `run` is sealed, or Err(elapsed) after `bound`.
    pub(super) async fn sealed(&self, run: &str, bound: Duration) -> Result<Snapshot, Duration> {
        self.sb
            .coordinator
            .wait_for(bound, |s| s.run(run).is_some_and(|r| r.finish.is_some()))
            .await
            .map_err(|_| self.started.elapsed())
    }

    pub(super) fn log(&self) -> Vec<Value> {
        self.sb
            .read_out("acp-log.jsonl")
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    pub(super) fn sent_methods(&self) -> Vec<String> {
        self.log()
            .iter()
            .filter(|r| r["k"] == "in")
            .filter_map(|r| r["msg"]["method"].as_str().map(str::to_string))
            .collect()
    }

    pub(super) async fn end(mut self) -> String {
        self.sb.coordinator.end_session();
        let runner = self.runner.take().unwrap();
        let (_status, out) = runner.finish().await;
        out
    }

    /// The runner's answer to the agent's permission request, as the
    /// agent logged it.
    pub(super) fn answer(&self) -> Value {
        self.log()
            .into_iter()
            .find(|r| r["k"] == "answer")
            .map(|r| r["result"].clone())
            .unwrap_or(Value::Null)
    }

    async fn kill(mut self) -> String {
        let runner = self.runner.take().unwrap();
        runner.kill().await
    }
}

fn finish(snap: &Snapshot, run: &str) -> Value {
    serde_json::to_value(snap.run(run).unwrap().finish.clone().unwrap()).unwrap()
}

fn events(snap: &Snapshot, run: &str) -> Vec<(String, Value)> {
    agent_events(&snap.run(run).unwrap().events)
}

fn all_events(snap: &Snapshot, run: &str) -> Vec<hosted_boot::wire::Event> {
    snap.run(run).unwrap().events.clone()
}

/// A control: the ordinary turn works.
#[tokio::test]
async fn probe_ok_control() {
    let p = Probe::start("ok", opts("hello"), &[], &[]).await;
    let snap = p.sealed("run-1", Duration::from_secs(30)).await.unwrap();
    let f = finish(&snap, "run-1");
    eprintln!("finish: {f}");
    eprintln!("events: {:?}", events(&snap, "run-1"));
    assert_eq!(f["status"], "succeeded");
    p.end().await;
}

/// A session/load the agent refuses, and the agent then does not exit on
/// stdin EOF (as the adapter's own doc says Codex's ACP agent does): the
/// promise is resume_failed → the turn reruns fresh.
#[tokio::test]
async fn probe_load_refused_agent_lingers() {
    let p = Probe::start(
        "load_refused_linger",
        CoordinatorOptions {
            agent_session_id: Some("stale-session".into()),
            ..opts("hello")
        },
        &[],
        &[],
    )
    .await;
    let got = p.sealed("run-1", Duration::from_secs(60)).await;
    let elapsed = p.started.elapsed();
    match got {
        Ok(snap) => {
            let f = finish(&snap, "run-1");
            eprintln!("PROBE load_refused_linger: sealed after {elapsed:?}: {f}");
            eprintln!("methods: {:?}", p.sent_methods());
            let out = p.end().await;
            let _ = out;
            assert_eq!(f["status"], "succeeded", "{f}");
            assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}");
        }
        Err(e) => {
            let out = p.kill().await;
            panic!(
                "not sealed after {e:?}\n{}",
                &out[out.len().saturating_sub(4000)..]
            );
        }
    }
}

/// The control for the above: the agent exits at stdin EOF.
#[tokio::test]
async fn probe_load_refused_agent_exits() {
    let p = Probe::start(
        "load_refused_exit",
        CoordinatorOptions {
            agent_session_id: Some("stale-session".into()),
            ..opts("hello")
        },
        &[],
        &[],
    )
    .await;
    let snap = p.sealed("run-1", Duration::from_secs(60)).await.unwrap();
    let f = finish(&snap, "run-1");
    eprintln!(
        "PROBE load_refused_exit: after {:?}: {f}",
        p.started.elapsed()
    );
    eprintln!("methods: {:?}", p.sent_methods());
    assert_eq!(f["status"], "succeeded", "{f}");
    assert!(f["agentSessionReset"].is_object(), "{f}");
    p.end().await;
}

/// A session/load replays history: not forwarded.
#[tokio::test]
async fn probe_load_replay_not_forwarded() {
    let p = Probe::start(
        "load_ok",
        CoordinatorOptions {
            agent_session_id: Some("old-session".into()),
            ..opts("hello")
        },
        &[],
        &[],
    )
    .await;
    let snap = p.sealed("run-1", Duration::from_secs(30)).await.unwrap();
    let f = finish(&snap, "run-1");
    let ev = events(&snap, "run-1");
    eprintln!("PROBE load_ok: {f}\n{ev:?}");
    assert!(!format!("{ev:?}").contains("OLD-"), "{ev:?}");
    assert_eq!(f["agentSessionId"], "old-session");
    p.end().await;
}

/// A JSON-RPC error response to an id the runner never used (99), mid-turn:
/// then a permission request. Promise: ignored; the turn goes on.
#[tokio::test]
async fn probe_stray_error_response() {
    let p = Probe::start("stray_err", opts("hello"), &[], &[]).await;
    let got = p.sealed("run-1", Duration::from_secs(45)).await;
    let log = p.log();
    let perm = log
        .iter()
        .find(|r| r["k"] == "answer" || r["k"] == "permission_unanswered")
        .cloned();
    match got {
        Ok(snap) => {
            let f = finish(&snap, "run-1");
            eprintln!(
                "PROBE stray_err: after {:?}: {f}\npermission: {perm:?}\nevents: {:?}",
                p.started.elapsed(),
                events(&snap, "run-1")
            );
            p.end().await;
            assert_eq!(f["status"], "succeeded", "{f}");
        }
        Err(e) => {
            p.kill().await;
            panic!("not sealed after {e:?}; permission: {perm:?}");
        }
    }
}

/// Same, right after initialize, with an agent that lingers at EOF.
#[tokio::test]
async fn probe_stray_error_response_at_init() {
    let p = Probe::start("stray_err_init_linger", opts("hello"), &[], &[]).await;
    let got = p.sealed("run-1", Duration::from_secs(45)).await;
    eprintln!("methods: {:?}", p.sent_methods());
    match got {
        Ok(snap) => {
            let f = finish(&snap, "run-1");
            eprintln!(
                "PROBE stray_err_init_linger: after {:?}: {f}",
                p.started.elapsed()
            );
            p.end().await;
            assert_eq!(f["status"], "succeeded", "{f}");
        }
        Err(e) => {
            p.kill().await;
            panic!("not sealed after {e:?}");
        }
    }
}

/// A response with id 2 (a setting's id) when the runner sent no setting.
#[tokio::test]
async fn probe_stray_ok_response_resends_prompt() {
    let p = Probe::start("stray_ok2", opts("hello"), &[], &[]).await;
    let snap = p.sealed("run-1", Duration::from_secs(30)).await.unwrap();
    let f = finish(&snap, "run-1");
    let prompts = p
        .sent_methods()
        .iter()
        .filter(|m| *m == "session/prompt")
        .count();
    eprintln!(
        "PROBE stray_ok2: {f}; session/prompt sent {prompts} times; methods {:?}",
        p.sent_methods()
    );
    p.end().await;
    assert_eq!(prompts, 1, "the prompt was sent {prompts} times");
}

/// The prompt's answer (id 3) before any session.
#[tokio::test]
async fn probe_prompt_answered_before_session() {
    let p = Probe::start("prompt_first", opts("hello"), &[], &[]).await;
    let snap = p.sealed("run-1", Duration::from_secs(30)).await.unwrap();
    let f = finish(&snap, "run-1");
    eprintln!("PROBE prompt_first: {f}; methods {:?}", p.sent_methods());
    let sent = p.sent_methods();
    p.end().await;
    // The stray answer is ignored: the prompt goes, once, and its own
    // answer ends the turn.
    let prompts = sent.iter().filter(|m| *m == "session/prompt").count();
    assert_eq!(prompts, 1, "{f}");
    assert_eq!(f["status"], "succeeded", "{f}");
}

/// Event types in the runner's namespace.
#[tokio::test]
async fn probe_spoofed_runner_events() {
    let p = Probe::start("spoof", opts("hello"), &[], &[]).await;
    let snap = p.sealed("run-1", Duration::from_secs(30)).await.unwrap();
    let all = all_events(&snap, "run-1");
    for e in &all {
        eprintln!("{} {}", e.kind, e.data);
    }
    let answer = p.log().into_iter().find(|r| r["k"] == "answer");
    eprintln!("answer to the hosted_boot.harvest request: {answer:?}");
    p.end().await;
    for e in &all {
        if e.kind.starts_with("hosted_boot.") {
            assert!(
                e.data.get("forged").is_none(),
                "forged: {} {}",
                e.kind,
                e.data
            );
        }
    }
}

/// session/update for another session.
#[tokio::test]
async fn probe_foreign_session_updates() {
    let p = Probe::start("foreign", opts("hello"), &[], &[]).await;
    let snap = p.sealed("run-1", Duration::from_secs(30)).await.unwrap();
    let ev = events(&snap, "run-1");
    eprintln!("PROBE foreign: {ev:?}");
    p.end().await;
    assert!(
        !format!("{ev:?}").contains("FOREIGN"),
        "another session's updates forwarded: {ev:?}"
    );
}

/// A secret in chunks (split), thought, tool title, update type,
/// permission, stderr.
#[tokio::test]
async fn probe_secrets_in_events() {
    let p = Probe::start("secrets", opts("hello"), &[], &[]).await;
    let snap = p.sealed("run-1", Duration::from_secs(30)).await.unwrap();
    let start = p.log()[0].clone();
    eprintln!("start: {start}");
    let all = all_events(&snap, "run-1");
    let text = serde_json::to_string(&all).unwrap();
    let decoded = serde_json::to_string(&agent_events(&all)).unwrap();
    let f = finish(&snap, "run-1");
    eprintln!("PROBE secrets: {f}\n{decoded}");
    p.end().await;
    assert_eq!(start["has_secret"], true);
    assert!(
        !text.contains(SECRET) && !decoded.contains(SECRET),
        "secret in events"
    );
    assert!(
        !text.contains("s3cr3t-value"),
        "part of the secret in events"
    );
}

/// The agent's session id is a secret value.
#[tokio::test]
async fn probe_secret_session_id() {
    let p = Probe::start("secret_sid", opts("hello"), &[], &[]).await;
    let snap = p.sealed("run-1", Duration::from_secs(30)).await.unwrap();
    let f = finish(&snap, "run-1");
    let all = serde_json::to_string(&all_events(&snap, "run-1")).unwrap();
    eprintln!("PROBE secret_sid: {f}");
    p.end().await;
    assert!(!all.contains(SECRET), "secret in events");
    assert!(!f.to_string().contains(SECRET), "secret in finish: {f}");
}

/// The prompt's error carries a secret in its data.
#[tokio::test]
async fn probe_secret_in_prompt_error() {
    let p = Probe::start("secret_error", opts("hello"), &[], &[]).await;
    let snap = p.sealed("run-1", Duration::from_secs(30)).await.unwrap();
    let f = finish(&snap, "run-1");
    eprintln!("PROBE secret_error: {f}");
    p.end().await;
    assert!(!f.to_string().contains(SECRET), "secret in finish: {f}");
}

/// Ignores session/cancel, SIGTERM and SIGINT, never exits at EOF, and
/// leaves a grandchild in a session of its own.
#[tokio::test]
async fn probe_ignores_cancel_and_signals() {
    let p = Probe::start("ignore_cancel", opts("hello"), &[], &[]).await;
    let started = p.sb.out().join("started");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !started.exists() {
        assert!(Instant::now() < deadline, "not started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let t0 = Instant::now();
    p.sb.coordinator.interrupt(Some("run-1")).unwrap();
    let snap = p.sealed("run-1", Duration::from_secs(30)).await.unwrap();
    let f = finish(&snap, "run-1");
    let took = t0.elapsed();
    let gc = super::support::Process::recorded(&p.sb.read_out("grandchild"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let gc_alive = gc.alive();
    eprintln!(
        "PROBE ignore_cancel: {f} after {took:?}; cancel seen: {}; grandchild alive: {gc_alive}",
        p.log().iter().any(|r| r["k"] == "cancel")
    );
    if gc_alive {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(gc.pid).unwrap(),
            rustix::process::Signal::KILL,
        );
    }
    p.end().await;
    assert_eq!(f["status"], "interrupted");
    assert!(!gc_alive, "grandchild left running");
}

/// Exits mid-turn, mid-message.
#[tokio::test]
async fn probe_exit_mid_turn() {
    let p = Probe::start("exit_mid", opts("hello"), &[], &[]).await;
    let snap = p.sealed("run-1", Duration::from_secs(30)).await.unwrap();
    let f = finish(&snap, "run-1");
    let ev = events(&snap, "run-1");
    eprintln!("PROBE exit_mid: {f}\n{ev:?}");
    p.end().await;
    assert_eq!(f["status"], "failed");
    assert!(format!("{ev:?}").contains("partial-message"));
}

/// Floods 10,000 chunks of 2,000 characters (20 MB) in one message, then
/// a plan and a short message.
#[tokio::test]
async fn probe_chunk_flood() {
    let p = Probe::start("flood", opts("hello"), &[], &[("FLOOD_N", "10000")]).await;
    let got = p.sealed("run-1", Duration::from_secs(90)).await;
    match got {
        Ok(snap) => {
            let f = finish(&snap, "run-1");
            let all = all_events(&snap, "run-1");
            let kinds: Vec<(String, usize)> = all
                .iter()
                .map(|e| (e.kind.clone(), e.data.to_string().len()))
                .collect();
            eprintln!("PROBE flood: {f}\nevents (type, bytes): {kinds:?}");
            let out = p.end().await;
            for l in out.lines().filter(|l| {
                l.contains("events")
                    && (l.contains("WARN") || l.contains("ERROR") || l.contains("refused"))
            }) {
                eprintln!("{}", &l[..l.len().min(600)]);
            }
            assert!(
                kinds.iter().any(|(k, _)| k == "plan"),
                "the plan after the flood was lost"
            );
        }
        Err(e) => {
            p.kill().await;
            panic!("not sealed after {e:?}");
        }
    }
}

/// One 40 MiB line.
#[tokio::test]
async fn probe_huge_line() {
    let p = Probe::start("huge_line", opts("hello"), &[], &[]).await;
    let got = p.sealed("run-1", Duration::from_secs(90)).await;
    match got {
        Ok(snap) => {
            let f = finish(&snap, "run-1");
            let all = all_events(&snap, "run-1");
            let kinds: Vec<(String, usize)> = all
                .iter()
                .map(|e| (e.kind.clone(), e.data.to_string().len()))
                .collect();
            eprintln!("PROBE huge_line: {f}\nevents: {kinds:?}");
            let ev = events(&snap, "run-1");
            p.end().await;
            assert_eq!(f["status"], "succeeded");
            assert!(format!("{ev:?}").contains("after-huge"));
        }
        Err(e) => {
            p.kill().await;
            panic!("not sealed after {e:?}");
        }
    }
}

/// Requests with weird ids; fs and terminal methods.
#[tokio::test]
async fn probe_weird_request_ids() {
    let p = Probe::start("weird_ids", opts("hello"), &[], &[]).await;
    let snap = p.sealed("run-1", Duration::from_secs(30)).await.unwrap();
    let f = finish(&snap, "run-1");
    let answers = p
        .log()
        .into_iter()
        .find(|r| r["k"] == "weird_answers")
        .unwrap();
    eprintln!("PROBE weird_ids: {f}");
    for a in answers["got"].as_array().unwrap() {
        eprintln!("  answer: {a}");
    }
    p.end().await;
    assert_eq!(f["status"], "succeeded");
}

/// Only an "always" option and a reject: promise, never "always".
#[tokio::test]
async fn probe_permission_only_always() {
    let p = Probe::start("perm_always", opts("hello"), &[], &[]).await;
    let snap = p.sealed("run-1", Duration::from_secs(30)).await.unwrap();
    let f = finish(&snap, "run-1");
    let answer = p.log().into_iter().find(|r| r["k"] == "answer").unwrap();
    eprintln!("PROBE perm_always: {f}; answer {answer}");
    p.end().await;
    // No "allow once" offered: "allow always" is the only grant (the
    // documented fallback), never a reject.
    assert_eq!(
        answer["msg"]["result"]["outcome"]["optionId"], "always",
        "{answer}"
    );
}

/// `--acp-permissions`: granted once by default, the agent's unattended
/// mode set; rejected once with `reject`, its mode kept so that it asks.
/// Either way the request is an event that carries the answer. (The
/// platform sets the variable, `HOSTED_BOOT_ACP_PERMISSIONS`.)
async fn permission_policy(env: &[(&str, &str)], option: &str, mode_set: bool) {
    let p = Probe::start("perm_policy", opts("hello"), &[], env).await;
    let snap = p.sealed("run-1", Duration::from_secs(30)).await.unwrap();
    let f = finish(&snap, "run-1");
    let answer = p.log().into_iter().find(|r| r["k"] == "answer").unwrap();
    let methods = p.sent_methods();
    p.end().await;
    assert_eq!(f["status"], "succeeded", "{f}");
    let picked = &answer["msg"]["result"]["outcome"]["optionId"];
    assert_eq!(picked, option, "{answer}");
    assert_eq!(
        methods.contains(&"session/set_mode".to_string()),
        mode_set,
        "{methods:?}"
    );
    let asked: Vec<Value> = events(&snap, "run-1")
        .into_iter()
        .filter(|(kind, _)| kind == "session/request_permission")
        .map(|(_, data)| data)
        .collect();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(
        asked[0]["runnerAnswer"]["outcome"]["optionId"], option,
        "{asked:?}"
    );
}

#[tokio::test]
async fn permissions_are_granted_by_default() {
    permission_policy(&[], "once", true).await;
}

#[tokio::test]
async fn permissions_are_rejected_with_acp_permissions_reject() {
    permission_policy(&[("HOSTED_BOOT_ACP_PERMISSIONS", "reject")], "no", false).await;
}

/// Mode and model set only when offered.
#[tokio::test]
async fn probe_modes_and_models() {
    let p = Probe::start(
        "modes",
        CoordinatorOptions {
            model: Some("gpt-x".into()),
            reasoning_effort: Some("high".into()),
            ..opts("hello")
        },
        &[],
        &[],
    )
    .await;
    let snap = p.sealed("run-1", Duration::from_secs(30)).await.unwrap();
    let f = finish(&snap, "run-1");
    let methods = p.sent_methods();
    eprintln!("PROBE modes: {f}; {methods:?}");
    let sets: Vec<Value> = p
        .log()
        .into_iter()
        .filter(|r| {
            r["k"] == "in"
                && r["msg"]["method"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("session/set"))
        })
        .map(|r| r["msg"].clone())
        .collect();
    eprintln!("sets: {sets:?}");
    p.end().await;
    assert!(methods.contains(&"session/set_mode".to_string()));
    assert!(!methods.contains(&"session/set_config_option".to_string()));
}

/// stopReason cancelled without an interrupt; garbage answer to initialize.
#[tokio::test]
async fn probe_unsolicited_cancel_and_garbage_init() {
    let p = Probe::start("unsolicited_cancel", opts("hello"), &[], &[]).await;
    let snap = p.sealed("run-1", Duration::from_secs(30)).await.unwrap();
    eprintln!("PROBE unsolicited_cancel: {}", finish(&snap, "run-1"));
    p.end().await;
    let p = Probe::start("garbage_init", opts("hello"), &[], &[]).await;
    let snap = p.sealed("run-1", Duration::from_secs(30)).await.unwrap();
    eprintln!(
        "PROBE garbage_init: {} {:?}",
        finish(&snap, "run-1"),
        events(&snap, "run-1")
    );
    p.end().await;
}

/// Never answers initialize; interrupted. And: never exits after its
/// terminal answer, ignoring SIGTERM.
#[tokio::test]
async fn probe_never_init_interrupted_and_never_exit() {
    let p = Probe::start("never_init", opts("hello"), &[], &[]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t0 = Instant::now();
    p.sb.coordinator.interrupt(Some("run-1")).unwrap();
    let snap = p.sealed("run-1", Duration::from_secs(30)).await.unwrap();
    eprintln!(
        "PROBE never_init interrupted: {} after {:?}",
        finish(&snap, "run-1"),
        t0.elapsed()
    );
    p.end().await;
    let p = Probe::start("never_exit", opts("hello"), &[], &[]).await;
    let snap = p.sealed("run-1", Duration::from_secs(30)).await.unwrap();
    eprintln!(
        "PROBE never_exit: {} after {:?}",
        finish(&snap, "run-1"),
        p.started.elapsed()
    );
    p.end().await;
}

/// Never answers initialize, not interrupted: how long until the turn
/// ends (the idle watchdog, 30 s at the test scale = 10 min in production).
#[tokio::test]
async fn probe_never_init_idle() {
    let p = Probe::start("never_init", opts("hello"), &[], &[]).await;
    let got = p.sealed("run-1", Duration::from_secs(60)).await;
    match got {
        Ok(snap) => {
            eprintln!(
                "PROBE never_init idle: {} after {:?}",
                finish(&snap, "run-1"),
                p.started.elapsed()
            );
            p.end().await;
        }
        Err(e) => {
            p.kill().await;
            panic!("not sealed after {e:?}");
        }
    }
    let _ = json!({});
}

/// An overloaded turn of an agent that does not load sessions: the
/// continuation's prompt goes to a fresh session.
#[tokio::test]
async fn probe_overload_continuation_without_load() {
    let p = Probe::start(
        "overload_no_load",
        opts("write the file PROBE-TASK.txt"),
        &[],
        &[],
    )
    .await;
    let snap = p.sealed("run-1", Duration::from_secs(30)).await.unwrap();
    let f = finish(&snap, "run-1");
    let prompts: Vec<Value> = p.log().into_iter().filter(|r| r["k"] == "prompt").collect();
    let sessions: Vec<Value> = p
        .log()
        .into_iter()
        .filter(|r| {
            r["k"] == "in"
                && r["msg"]["method"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("session/new") || m.starts_with("session/load"))
        })
        .map(|r| r["msg"].clone())
        .collect();
    eprintln!("PROBE overload_no_load: {f}\nprompts: {prompts:?}\nsessions: {sessions:?}");
    let kinds: Vec<String> = all_events(&snap, "run-1")
        .iter()
        .map(|e| e.kind.clone())
        .collect();
    eprintln!("events: {kinds:?}");
    p.end().await;
    assert!(
        prompts
            .iter()
            .skip(1)
            .all(|r| r["text"].as_str().unwrap().contains("PROBE-TASK")),
        "a continuation prompt without the task went to a fresh session: {prompts:?}"
    );
}

/// A 200,000-character session id: the next turn.
#[tokio::test]
async fn probe_huge_session_id() {
    let p = Probe::start("huge_sid", opts("hello"), &[], &[]).await;
    let snap = p.sealed("run-1", Duration::from_secs(30)).await.unwrap();
    let f = finish(&snap, "run-1");
    eprintln!(
        "PROBE huge_sid run-1: {} sid len {}",
        f["status"],
        f["agentSessionId"].as_str().map_or(0, str::len)
    );
    let run = p.sb.coordinator.queue_turn("again", None);
    let snap = p.sealed(&run, Duration::from_secs(30)).await.unwrap();
    let f2 = finish(&snap, &run);
    eprintln!(
        "PROBE huge_sid {run}: status {} error {}",
        f2["status"], f2["error"]
    );
    let starts = p.log().into_iter().filter(|r| r["k"] == "start").count();
    eprintln!("agent processes started: {starts}");
    p.end().await;
    assert_eq!(f2["status"], "succeeded", "{}", f2["error"]);
}

/// The real Claude Code ACP agent asked to resume a session it has no
/// state for (a new sandbox): promise, resume_failed → a fresh session.
#[tokio::test]
async fn probe_real_acp_stale_session() {
    use super::real_acp::{Agent, Case};
    let Some(case) = Case::start_from(
        Agent::Claude,
        CoordinatorOptions {
            task: "write:one.txt".into(),
            agent_session_id: Some("3f1c8a57-0000-4000-8000-000000000000".into()),
            ..CoordinatorOptions::default()
        },
    )
    .await
    else {
        return;
    };
    let sb = &case.sb;
    let runner = Runner::reading(case.command().spawn().unwrap());
    let t0 = Instant::now();
    let got = sb
        .coordinator
        .wait_for(Duration::from_secs(120), |s| {
            s.run("run-1").is_some_and(|r| r.finish.is_some())
        })
        .await;
    let Ok(snap) = got else {
        let out = runner.kill().await;
        super::real_clis::kill_leftovers(&sb.root());
        panic!(
            "not sealed after {:?}\n{}",
            t0.elapsed(),
            &out[out.len().saturating_sub(6000)..]
        );
    };
    let f = finish(&snap, "run-1");
    eprintln!("PROBE real stale session: after {:?}: {f}", t0.elapsed());
    sb.coordinator.end_session();
    let _ = runner.finish().await;
    assert_eq!(f["status"], "succeeded", "{f}");
    assert!(f["agentSessionReset"].is_object(), "{f}");
}
