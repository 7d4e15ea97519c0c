//! The agent adapters end to end: the real binary with `--agent claude |
//! codex | codex-exec | opencode | opencode-run` against the reference
//! coordinator, driving stand-in CLIs (`tests/fakes/`, first on `PATH`)
//! that check the arguments and stdin they get and replay the real event
//! formats: stream-json lines, JSON-RPC messages, an HTTP server with an
//! event stream. A turn's prompt names the stand-in's scenario
//! (`scenario:<name>`); each stand-in logs what it saw to
//! `$AGENT_OUT/<cli>.log`.

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hosted_boot::wire::FinishBody;
use hosted_boot_coordinator::{CoordinatorOptions, Snapshot};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

use super::support::{Group, Sandbox, WAIT, agent_events, assert_events_clean, kill_group};

const FAKES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fakes");
const PLACEHOLDER: &str = "HOSTED_BOOT_PROVIDER_PLACEHOLDER_KEY";

/// The runner for `agent`, the stand-ins first on `PATH`.
fn agent_runner(sb: &Sandbox, agent: &str) -> Command {
    let mut cmd = sb.command("run", Path::new("/nonexistent"));
    let path = format!("{FAKES}:{}", std::env::var("PATH").unwrap_or_default());
    cmd.env("PATH", path)
        .env("HOSTED_BOOT_AGENT", agent)
        .env_remove("HOSTED_BOOT_AGENT_COMMAND");
    cmd
}

fn opts(task: &str) -> CoordinatorOptions {
    CoordinatorOptions {
        task: task.into(),
        ..CoordinatorOptions::default()
    }
}

/// A runner whose stdout and stderr are read as they come: a trace-level
/// log is large, and a runner blocked on a full stderr pipe stalls.
struct Runner {
    child: Child,
    output: Arc<Mutex<Vec<u8>>>,
    readers: Vec<tokio::task::JoinHandle<()>>,
}

impl Runner {
    fn spawn(cmd: &mut Command) -> Runner {
        let mut child = cmd.spawn().unwrap();
        let output = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        let pipes: Vec<Box<dyn tokio::io::AsyncRead + Unpin + Send>> = vec![
            Box::new(child.stdout.take().unwrap()),
            Box::new(child.stderr.take().unwrap()),
        ];
        for mut pipe in pipes {
            let output = output.clone();
            readers.push(tokio::spawn(async move {
                let mut buf = [0u8; 8192];
                while let Ok(n) = pipe.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    output.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            }));
        }
        Runner {
            child,
            output,
            readers,
        }
    }

    fn output(&self) -> String {
        String::from_utf8_lossy(&self.output.lock().unwrap()).into_owned()
    }

    /// Waits (bounded) for the runner to exit; its status and output.
    async fn finish(mut self) -> (ExitStatus, String) {
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("the runner did not exit in time")
            .unwrap();
        for r in self.readers.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), r).await;
        }
        (status, self.output())
    }
}

/// What a stand-in logged.
fn log(sb: &Sandbox, cli: &str) -> Vec<Value> {
    sb.read_out(&format!("{cli}.log"))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn records<'a>(log: &'a [Value], kind: &str) -> Vec<&'a Value> {
    log.iter().filter(|r| r["kind"] == kind).collect()
}

fn sealed(snap: &Snapshot, run: &str) -> FinishBody {
    snap.run(run).unwrap().finish.clone().unwrap()
}

fn events<'a>(snap: &'a Snapshot, run: &str, kind: &str) -> Vec<&'a Value> {
    snap.run(run)
        .unwrap()
        .events
        .iter()
        .filter(|e| e.kind == kind)
        .map(|e| &e.data)
        .collect()
}

fn usage(body: &FinishBody) -> Value {
    serde_json::to_value(&body.usage).unwrap()
}

fn error_code(body: &FinishBody) -> String {
    body.error
        .as_ref()
        .map(|e| {
            serde_json::to_value(e.code)
                .unwrap()
                .as_str()
                .unwrap()
                .to_string()
        })
        .unwrap_or_default()
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Waits until `run` is sealed; on a timeout, kills the runner and fails
/// with its log and what the stand-ins saw.
async fn sealed_or_log(sb: &Sandbox, runner: &mut Runner, run: &str) -> Snapshot {
    let got = sb
        .coordinator
        .wait_for(WAIT, |s| s.run(run).is_some_and(|r| r.finish.is_some()))
        .await;
    match got {
        Ok(snap) => snap,
        Err(e) => {
            let _ = runner.child.start_kill();
            // A runner killed outright leaves its agent's group behind.
            for cli in ["claude", "codex", "opencode"] {
                for start in records(&log(sb, cli), "start") {
                    if let (Some(pid), Some(started)) =
                        (start["pid"].as_i64(), start["start_time"].as_u64())
                    {
                        kill_group(&Group::recorded(&format!("{pid} {started}")));
                    }
                }
            }
            let out = runner.output();
            let log: Vec<&str> = out
                .lines()
                .filter(|l| l.contains("\"target\":\"hosted_boot"))
                .collect();
            let mut fakes = String::new();
            for entry in std::fs::read_dir(sb.out()).unwrap().flatten() {
                let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                fakes.push_str(&format!("== {}\n{text}", entry.path().display()));
            }
            panic!(
                "{run} was not sealed: {e:?}\nrunner log:\n{}\nstand-ins:\n{fakes}",
                log.join("\n")
            );
        }
    }
}

/// Boots, runs the first turn to its seal, then a second turn with
/// `second` as its prompt, ends the session; returns the final state.
async fn two_turns(sb: &Sandbox, mut cmd: Command, second: &str) -> Snapshot {
    let mut child = Runner::spawn(&mut cmd);
    sealed_or_log(sb, &mut child, "run-1").await;
    let next = sb.coordinator.queue_turn(second, None);
    assert_eq!(next, "run-2");
    sealed_or_log(sb, &mut child, "run-2").await;
    sb.coordinator.end_session();
    let (status, output) = child.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    sb.coordinator.snapshot()
}

/// Boots with `task` as the first prompt and returns the seal of `run-1`
/// (a failed turn ends the boot with exit 1).
async fn one_failed_turn(sb: &Sandbox, cmd: &mut Command) -> (FinishBody, String) {
    let mut child = Runner::spawn(cmd);
    let snap = sealed_or_log(sb, &mut child, "run-1").await;
    let (status, output) = child.finish().await;
    let body = sealed(&snap, "run-1");
    assert_eq!(status.code(), Some(1), "{body:?}\n{output}");
    (body, output)
}

/// Waits until `run` has an event of `kind`.
async fn wait_event(sb: &Sandbox, run: &str, kind: &str) {
    sb.coordinator
        .wait_for(WAIT, |s| {
            s.run(run)
                .is_some_and(|r| r.events.iter().any(|e| e.kind == kind))
        })
        .await
        .unwrap();
}

/// The stand-in's process (its own group's leader) is gone with its group.
fn assert_group_gone(sb: &Sandbox, cli: &str) {
    for start in records(&log(sb, cli), "start") {
        let pid = start["pid"].as_i64().unwrap();
        let started = start["start_time"].as_u64().unwrap();
        let group = Group::recorded(&format!("{pid} {started}"));
        assert_eq!(
            group.live_members(),
            Vec::<i32>::new(),
            "{cli} {pid} survived"
        );
    }
}

/// What the skeleton tests of a turn's interrupt, linger and silence need
/// to know of an adapter and its stand-in: one row per CLI, the same
/// skeleton for each ([`interrupted_turn`], [`lingering_turn`],
/// [`silent_turn_is_hung`]); each test adds what is its CLI's own.
struct Cli {
    /// `--agent`, and the stand-in whose log is read.
    agent: &'static str,
    /// An event the CLI sends while it works (the interrupt comes after).
    working: &'static str,
    /// The stand-in's record of the protocol interrupt it received.
    interrupt: &'static str,
}

const CLAUDE: Cli = Cli {
    agent: "claude",
    working: "assistant",
    interrupt: "interrupt_received",
};

const CODEX: Cli = Cli {
    agent: "codex",
    working: "item/completed",
    interrupt: "interrupt_received",
};

const OPENCODE: Cli = Cli {
    agent: "opencode",
    working: "message.part.updated",
    interrupt: "abort_received",
};

/// A first turn on `task`, the session ended at its seal: the runner exits
/// 0 and the CLI's group is gone.
struct Turn {
    snap: Snapshot,
    output: String,
    log: Vec<Value>,
}

/// The first turn interrupted once the CLI works: sealed `interrupted`,
/// exactly one protocol interrupt received.
async fn interrupted_turn(cli: &Cli, task: &str) -> Turn {
    let sb = Sandbox::start(opts(task)).await;
    let child = Runner::spawn(&mut agent_runner(&sb, cli.agent));
    wait_event(&sb, "run-1", cli.working).await;
    sb.coordinator.interrupt(Some("run-1")).unwrap();
    let turn = ended_turn(&sb, cli, child).await;
    assert_eq!(sealed(&turn.snap, "run-1").status.as_str(), "interrupted");
    assert_eq!(records(&turn.log, cli.interrupt).len(), 1, "{task}");
    turn
}

/// The first turn of a CLI that lingers after its terminal event (`task`
/// says how): stopped, the turn `succeeded`.
async fn lingering_turn(cli: &Cli, task: &str) -> Turn {
    let sb = Sandbox::start(opts(task)).await;
    let child = Runner::spawn(&mut agent_runner(&sb, cli.agent));
    let turn = ended_turn(&sb, cli, child).await;
    assert_eq!(sealed(&turn.snap, "run-1").status.as_str(), "succeeded");
    turn
}

/// `run-1` sealed, the session ended, the runner's exit 0, the group gone.
async fn ended_turn(sb: &Sandbox, cli: &Cli, mut child: Runner) -> Turn {
    let snap = sealed_or_log(sb, &mut child, "run-1").await;
    sb.coordinator.end_session();
    let (status, output) = child.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_group_gone(sb, cli.agent);
    Turn {
        snap,
        output,
        log: log(sb, cli.agent),
    }
}

/// A CLI silent past the idle timeout (20 s scaled by the test time scale:
/// 1 s): failed `agent_hung`, not retryable, its group gone.
async fn silent_turn_is_hung(cli: &Cli) {
    let sb = Sandbox::start(opts("scenario:silent Anything")).await;
    let (body, _) = one_failed_turn(
        &sb,
        agent_runner(&sb, cli.agent).env("HOSTED_BOOT_AGENT_IDLE_TIMEOUT", "20s"),
    )
    .await;
    assert_eq!(error_code(&body), "agent_hung");
    assert!(!body.error.as_ref().unwrap().retryable);
    assert_group_gone(&sb, cli.agent);
}

fn repo(sb: &Sandbox) -> PathBuf {
    std::fs::canonicalize(sb.root()).unwrap().join("repo")
}

/// A session the stand-in `cli` knows, in `repo/` (as a previous sandbox
/// on the same disk would have left it).
fn stored_session(sb: &Sandbox, cli: &str, id: &str, scenario: &str) {
    let dir = sb.dir.path().join(format!(".fake-{cli}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(format!("{id}.json")),
        json!({"cwd": repo(sb), "scenario": scenario, "turns": 1, "attempts": 0}).to_string(),
    )
    .unwrap();
}

// ------------------------------------------------------------------ claude

#[tokio::test]
async fn claude_completes_a_turn_with_usage_and_resumes_it_on_the_next() {
    let sb = Sandbox::start(CoordinatorOptions {
        model: Some("claude-opus-4".into()),
        reasoning_effort: Some("high".into()),
        ..opts("scenario:complete Write the docs")
    })
    .await;
    let mut cmd = agent_runner(&sb, "claude");
    cmd.env("CLAUDECODE", "1")
        .env("CLAUDE_CODE_ENTRYPOINT", "cli")
        .arg("--agent-arg=--max-turns=7")
        .args(["--agent-env", "FAKE_EXTRA=yes"]);
    let snap = two_turns(&sb, cmd, "scenario:complete And the tests").await;

    let log = log(&sb, "claude");
    let turns = records(&log, "turn");
    let sid = turns[0]["session"].as_str().unwrap().to_string();
    let first = sealed(&snap, "run-1");
    assert_eq!(first.status.as_str(), "succeeded");
    assert_eq!(first.agent_session_id.as_deref(), Some(sid.as_str()));
    assert_eq!(
        usage(&first),
        json!({"model": "claude-opus-4", "inputTokens": 100, "outputTokens": 50,
               "cacheReadTokens": 1000, "cacheWriteTokens": 200, "costUsd": 0.0123})
    );
    // The agent does not wait for `--version`: the runner's event is first
    // unless the probe answered after the agent started.
    let runner = events(&snap, "run-1", "hosted_boot.runner");
    assert_eq!(runner.len(), 1);
    assert_eq!(runner[0]["agent"], "claude");
    assert_eq!(runner[0]["cliVersion"], "2.1.240 (Claude Code)");
    assert_eq!(
        events(&snap, "run-1", "hosted_boot.agent_session"),
        vec![&json!({"agentSessionId": sid, "requested": null, "resumed": false})]
    );
    assert_eq!(events(&snap, "run-1", "result").len(), 1);
    assert!(
        events(&snap, "run-1", "output")
            .iter()
            .any(|d| d["text"].as_str().unwrap_or("").contains("[SandboxDebug]"))
    );

    // What the CLI got: flags, not the prompt; the prompt on stdin after
    // the initialize request; a cleaned environment.
    let starts = records(&log, "start");
    assert_eq!(starts.len(), 2);
    let argv: Vec<&str> = starts[0]["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        argv,
        vec![
            "-p",
            "--output-format",
            "stream-json",
            "--input-format",
            "stream-json",
            "--verbose",
            "--permission-mode",
            "bypassPermissions",
            "--model=claude-opus-4",
            "--effort=high",
            "--max-turns=7"
        ]
    );
    let env = &starts[0]["env"];
    assert_eq!(env.get("CLAUDECODE"), None);
    assert_eq!(env.get("CLAUDE_CODE_ENTRYPOINT"), None);
    assert_eq!(env["ANTHROPIC_API_KEY"], PLACEHOLDER);
    assert_eq!(env["FAKE_EXTRA"], "yes");
    assert_eq!(env.get("ORIZU_AGENT_SESSION_ID"), None);
    assert_eq!(env.get("IS_SANDBOX").is_some(), is_root());
    let stdin: Vec<&Value> = records(&log, "stdin")
        .into_iter()
        .filter(|r| r["run"] == "run-1")
        .collect();
    assert_eq!(stdin[0]["message"]["request"]["subtype"], "initialize");
    assert_eq!(
        stdin[1]["message"]["message"]["content"],
        "scenario:complete Write the docs"
    );
    assert_eq!(
        records(&log, "exit").len(),
        2,
        "stdin was closed after result"
    );

    // Turn 2 resumed the session in the same directory.
    assert!(
        starts[1]["argv"]
            .as_array()
            .unwrap()
            .contains(&json!(format!("--resume={sid}")))
    );
    assert_eq!(starts[1]["env"]["ORIZU_AGENT_SESSION_ID"], sid.as_str());
    assert_eq!(starts[0]["cwd"], starts[1]["cwd"]);
    let second = sealed(&snap, "run-2");
    assert_eq!(second.agent_session_id.as_deref(), Some(sid.as_str()));
    assert_eq!(
        events(&snap, "run-2", "hosted_boot.agent_session"),
        vec![&json!({"agentSessionId": sid, "requested": sid, "resumed": true})]
    );
    assert_eq!(snap.session.agent_session_id.as_deref(), Some(sid.as_str()));
}

#[tokio::test]
async fn claude_resumes_the_coordinators_session_and_carries_a_new_id_it_reports() {
    let sb = Sandbox::start(CoordinatorOptions {
        agent_session_id: Some("sess-from-coordinator".into()),
        ..opts("scenario:fork Continue")
    })
    .await;
    stored_session(&sb, "claude", "sess-from-coordinator", "complete");
    let mut child = Runner::spawn(&mut agent_runner(&sb, "claude"));
    let snap = sealed_or_log(&sb, &mut child, "run-1").await;
    sb.coordinator.end_session();
    let (status, output) = child.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");

    let log = log(&sb, "claude");
    assert!(
        records(&log, "start")[0]["argv"]
            .as_array()
            .unwrap()
            .contains(&json!("--resume=sess-from-coordinator"))
    );
    let reported = records(&log, "turn")[0]["session"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(reported, "sess-from-coordinator");
    let body = sealed(&snap, "run-1");
    assert_eq!(body.agent_session_id.as_deref(), Some(reported.as_str()));
    assert_eq!(
        events(&snap, "run-1", "hosted_boot.agent_session"),
        vec![
            &json!({"agentSessionId": reported, "requested": "sess-from-coordinator",
                     "resumed": false})
        ]
    );
    assert!(output.contains("another session than the one it was asked to resume"));
}

#[tokio::test]
async fn claude_is_interrupted_through_its_protocol() {
    let turn = interrupted_turn(&CLAUDE, "scenario:interrupt Long work").await;
    let body = sealed(&turn.snap, "run-1");
    assert_eq!(body.error, None);
    // It ended through the protocol: the result, then EOF, a clean exit.
    assert_eq!(records(&turn.log, "exit")[0]["code"], 0);
    let stdin = records(&turn.log, "stdin");
    assert_eq!(
        stdin.last().unwrap()["message"]["request"]["subtype"],
        "interrupt"
    );
    assert!(body.agent_session_id.is_some());
}

#[tokio::test]
async fn claude_ignoring_the_interrupt_is_stopped_by_signals() {
    let turn = interrupted_turn(&CLAUDE, "scenario:ignore-interrupt Long work").await;
    assert!(records(&turn.log, "exit").is_empty());
    assert!(turn.output.contains("SIGKILL"), "{}", turn.output);
}

#[tokio::test]
async fn claude_lingering_after_its_result_is_stopped_and_the_outcome_kept() {
    let started = Instant::now();
    let turn = lingering_turn(&CLAUDE, "scenario:hang-after-result Quick").await;
    let body = sealed(&turn.snap, "run-1");
    assert!(usage(&body)["costUsd"].is_number());
    assert_eq!(records(&turn.log, "hanging").len(), 1);
    assert!(
        turn.output.contains("terminal event but is still running"),
        "{}",
        turn.output
    );
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[tokio::test]
async fn claude_silent_is_failed_agent_hung_by_the_idle_watchdog() {
    silent_turn_is_hung(&CLAUDE).await;
}

/// One failed first turn per scenario, all at once; returns the seals in
/// the order of `scenarios`.
async fn error_seals(agent: &str, scenarios: &[&str]) -> Vec<FinishBody> {
    let runs = scenarios.iter().map(|scenario| {
        let opts = opts(&format!("scenario:{scenario} Do it"));
        async move {
            let sb = Sandbox::start(opts).await;
            let (body, _) = one_failed_turn(&sb, &mut agent_runner(&sb, agent)).await;
            body
        }
    });
    futures_util::future::join_all(runs).await
}

/// `(scenario, code, retryable)`.
fn expect_codes(seals: &[FinishBody], want: &[(&str, &str, bool)]) {
    let got: Vec<(String, String, bool)> = seals
        .iter()
        .zip(want)
        .map(|(b, (s, _, _))| {
            (
                s.to_string(),
                error_code(b),
                b.error.as_ref().is_some_and(|e| e.retryable),
            )
        })
        .collect();
    let want: Vec<(String, String, bool)> = want
        .iter()
        .map(|(s, c, r)| (s.to_string(), c.to_string(), *r))
        .collect();
    assert_eq!(got, want);
    for b in seals {
        assert_eq!(b.status.as_str(), "failed");
        assert!(!b.error.as_ref().unwrap().message.is_empty());
    }
}

const CLASSES: &[(&str, &str, bool)] = &[
    ("quota", "provider_quota_exhausted", false),
    ("rate-limited", "provider_rate_limited", true),
    ("limit-unknown", "provider_limit_unknown", false),
    ("overloaded", "provider_overloaded", false),
    ("server-error", "provider_server_error", false),
    ("auth", "provider_auth", false),
    ("context", "context_window_exceeded", false),
    ("invalid", "invalid_request", false),
    ("crash", "agent_crashed", false),
];

#[tokio::test]
async fn claude_failures_are_classified() {
    let scenarios: Vec<&str> = CLASSES.iter().map(|c| c.0).collect();
    let seals = error_seals("claude", &scenarios).await;
    expect_codes(&seals, CLASSES);
    // The quota's reset time came from the rejected rate_limit_event.
    assert_eq!(
        seals[0].error.as_ref().unwrap().resets_at.as_deref(),
        Some("2030-03-17T17:46:40Z")
    );
    // A crash carries the stderr tail.
    assert!(
        seals[8]
            .error
            .as_ref()
            .unwrap()
            .message
            .contains("Cannot read properties")
    );
}

/// Issue 39, the interim fix: the coordinator names an agent session this
/// sandbox's CLI has no state for (a new sandbox). The CLI refuses the
/// resume; the turn then runs in a fresh agent session instead of failing
/// `resume_failed`, says so in a `hosted_boot.agent_session_reset` event
/// and in `finish.agentSessionReset`, and carries the new session on.
#[tokio::test]
async fn a_refused_resume_runs_the_turn_in_a_fresh_agent_session() {
    let runs =
        ["claude", "codex", "codex-exec", "opencode", "opencode-run"].map(|agent| async move {
            let sb = Sandbox::start(CoordinatorOptions {
                agent_session_id: Some("no-such-session".into()),
                ..opts("scenario:complete Go on")
            })
            .await;
            let mut child = Runner::spawn(&mut agent_runner(&sb, agent));
            let snap = sealed_or_log(&sb, &mut child, "run-1").await;
            sb.coordinator.end_session();
            let (status, output) = child.finish().await;
            (agent, snap, status, output)
        });
    for (agent, snap, status, output) in futures_util::future::join_all(runs).await {
        assert_eq!(status.code(), Some(0), "{agent}: {output}");
        let body = sealed(&snap, "run-1");
        assert_eq!(body.status.as_str(), "succeeded", "{agent}: {body:?}");
        assert_eq!(body.error, None, "{agent}");
        let reset = body
            .agent_session_reset
            .as_ref()
            .unwrap_or_else(|| panic!("{agent}: no agentSessionReset in {body:?}"));
        assert_eq!(reset.requested, "no-such-session", "{agent}");
        assert!(!reset.reason.is_empty(), "{agent}");
        let fresh = body.agent_session_id.clone().unwrap_or_default();
        assert!(
            !fresh.is_empty() && fresh != "no-such-session",
            "{agent}: {fresh:?}"
        );
        assert_eq!(
            events(&snap, "run-1", "hosted_boot.agent_session_reset"),
            vec![&json!({"requested": "no-such-session", "reason": reset.reason})],
            "{agent}"
        );
        assert_eq!(
            snap.session.agent_session_id.as_deref(),
            Some(fresh.as_str()),
            "{agent}: the coordinator carries the fresh session"
        );
        assert!(
            output.contains("running the turn in a fresh agent session"),
            "{agent}: {output}"
        );
    }
}

/// Waits until the stand-in `cli` has logged `n` starts.
async fn wait_starts(sb: &Sandbox, cli: &str, n: usize) {
    let deadline = std::time::Instant::now() + WAIT;
    while records(&log(sb, cli), "start").len() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{cli} started {} times, not {n}",
            records(&log(sb, cli), "start").len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Turn 1 of `cli` sealed (`--prestart-agent on`) and its CLI pre-started
/// for turn 2: the sandbox, the runner, turn 1's seal.
async fn first_turn_prestarted(cli: &str) -> (Sandbox, Runner, FinishBody) {
    let sb = Sandbox::start(opts("scenario:complete First")).await;
    let mut child = Runner::spawn(agent_runner(&sb, cli).args(["--prestart-agent", "on"]));
    let first = sealed(&sealed_or_log(&sb, &mut child, "run-1").await, "run-1");
    wait_starts(&sb, cli, 2).await;
    (sb, child, first)
}

/// Kills the CLI `cli` pre-started for turn 2 (its second start).
fn kill_prestarted(sb: &Sandbox, cli: &str) {
    let waiting = records(&log(sb, cli), "start")[1]["pid"].as_i64().unwrap();
    super::support::signal(
        u32::try_from(waiting).unwrap(),
        rustix::process::Signal::KILL,
    );
}

/// Turn 1 of `cli`, its CLI pre-started for turn 2 (before that turn is
/// queued), turn 2 run and resuming turn 1's session, the CLI for turn 3
/// started, then the session's end: the sandbox, turn 2's run, the agent
/// session, the runner's output.
async fn second_turn_prestarted(cli: &str) -> (Sandbox, String, String, String) {
    let (sb, mut child, first) = first_turn_prestarted(cli).await;
    let session = first.agent_session_id.clone().expect("an agent session");
    assert_eq!(records(&log(&sb, cli), "start").len(), 2);
    let run = sb.coordinator.queue_turn("scenario:complete Second", None);
    let snap = sealed_or_log(&sb, &mut child, &run).await;
    // Started for turn 3, which never comes: the session ends.
    wait_starts(&sb, cli, 3).await;
    sb.coordinator.end_session();
    let (status, output) = child.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    let second = sealed(&snap, &run);
    assert_eq!(second.status.as_str(), "succeeded", "{second:?}");
    assert_eq!(second.agent_session_id.as_deref(), Some(session.as_str()));
    (sb, run, session, output)
}

/// Issue 38: with `--prestart-agent on`, Claude Code is started for the
/// next turn while the runner waits for it: the turn hands the waiting
/// process its prompt (no second start), which learns its run from the
/// turn file, resumes the first turn's session, and is this turn's to
/// supervise; the one started for a third turn that never comes is killed
/// when the session ends.
#[tokio::test]
async fn claude_prestarted_for_the_next_turn_takes_its_prompt() {
    let (sb, run, sid, output) = second_turn_prestarted("claude").await;
    let log = log(&sb, "claude");
    let starts = records(&log, "start");
    assert_eq!(starts.len(), 3, "{log:?}");
    let prestarted = starts[1];
    assert!(
        prestarted["argv"]
            .as_array()
            .unwrap()
            .contains(&json!(format!("--resume={sid}"))),
        "{prestarted}"
    );
    assert!(
        prestarted["env"].get("ORIZU_RUN_ID").is_none(),
        "a pre-started agent has no per-turn variable: {prestarted}"
    );
    let turns = records(&log, "turn");
    assert_eq!(turns.len(), 2, "{log:?}");
    assert_eq!(
        turns[1]["pid"], prestarted["pid"],
        "turn 2 ran in another process"
    );
    assert_eq!(turns[1]["run"], json!(run));
    let files = records(&log, "turn_file");
    assert_eq!(files.len(), 1, "{log:?}");
    assert_eq!(files[0]["turn"]["runId"], json!(run));
    assert_eq!(files[0]["turn"]["ordinal"], 2);
    assert!(
        output.contains("the turn uses the pre-started agent"),
        "{output}"
    );
    assert!(output.contains("pre-started agent discarded"), "{output}");
    assert_group_gone(&sb, "claude");
}

/// Issue 38, Codex app-server: the process started for turn 2 waits for
/// the runner's JSON-RPC, then resumes turn 1's thread for turn 2.
#[tokio::test]
async fn codex_prestarted_for_the_next_turn_resumes_its_thread() {
    let (sb, run, _, output) = second_turn_prestarted("codex").await;
    let log = log(&sb, "codex");
    let starts = records(&log, "start");
    let files = records(&log, "turn_file");
    assert_eq!(files.len(), 1, "{log:?}");
    assert_eq!(files[0]["pid"], starts[1]["pid"]);
    assert_eq!(files[0]["turn"]["runId"], json!(run));
    assert!(
        output.contains("the turn uses the pre-started agent"),
        "{output}"
    );
    assert_group_gone(&sb, "codex");
}

/// A pre-started opencode server the turn does not use (it died) takes its
/// password with it: the turn's cold server gets a password of its own
/// (found by a review of issue 38: the adapter had adopted the discarded
/// server's).
#[tokio::test]
async fn a_discarded_prestarted_opencode_server_leaves_its_password_behind() {
    let (sb, mut child, _) = first_turn_prestarted("opencode").await;
    kill_prestarted(&sb, "opencode");
    let run = sb.coordinator.queue_turn("scenario:complete Second", None);
    let snap = sealed_or_log(&sb, &mut child, &run).await;
    assert_eq!(sealed(&snap, &run).status.as_str(), "succeeded");
    sb.coordinator.end_session();
    let (status, output) = child.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert!(output.contains("it exited before its turn"), "{output}");
    let log = log(&sb, "opencode");
    let starts = records(&log, "start");
    let turns = records(&log, "turn");
    assert_eq!(
        turns[1]["pid"], starts[2]["pid"],
        "turn 2 started cold: {log:?}"
    );
    assert_ne!(
        starts[2]["password_digest"], starts[1]["password_digest"],
        "{log:?}"
    );
}

/// A pre-started agent has no run id in its environment, even when the
/// runner's own environment gives one (`ORIZU_RUN_ID`, accepted for
/// compatibility): it learns its run from the turn file (found by a review
/// of issue 38: the process started for run-2 kept `run-1`).
#[tokio::test]
async fn a_prestarted_agent_has_no_run_id_even_when_the_runners_environment_has_one() {
    let sb = Sandbox::start(opts("scenario:complete First")).await;
    let mut cmd = agent_runner(&sb, "claude");
    cmd.env("ORIZU_RUN_ID", "run-1")
        .args(["--prestart-agent", "on"]);
    let mut child = Runner::spawn(&mut cmd);
    sealed_or_log(&sb, &mut child, "run-1").await;
    wait_starts(&sb, "claude", 2).await;
    let run = sb.coordinator.queue_turn("scenario:complete Second", None);
    let snap = sealed_or_log(&sb, &mut child, &run).await;
    assert_eq!(sealed(&snap, &run).status.as_str(), "succeeded");
    sb.coordinator.end_session();
    let (status, output) = child.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    let log = log(&sb, "claude");
    let starts = records(&log, "start");
    assert_eq!(starts[1]["env"].get("ORIZU_RUN_ID"), None, "{log:?}");
    let turns = records(&log, "turn");
    assert_eq!(turns[1]["run"], run.as_str(), "{log:?}");
    assert_eq!(
        turns[1]["pid"], starts[1]["pid"],
        "turn 2 used the pre-started CLI"
    );
}

/// Issue 38: a stop signal while a pre-started agent waits for its turn
/// kills it with its tree; the runner exits as a stop between turns does.
#[tokio::test]
async fn a_stop_while_a_prestarted_claude_waits_leaves_nothing() {
    let (sb, child, _) = first_turn_prestarted("claude").await;
    super::support::signal(child.child.id().unwrap(), rustix::process::Signal::TERM);
    let (status, output) = child.finish().await;
    assert_eq!(status.code(), Some(143), "{output}");
    assert!(output.contains("pre-started agent discarded"), "{output}");
    assert_group_gone(&sb, "claude");
    assert_eq!(sb.coordinator.snapshot().runs.len(), 1);
}

/// Issue 38: a pre-started agent that died before its turn, and one whose
/// work tree the turn's workspace sync changed (someone pushed a
/// `CLAUDE.md` meanwhile), are not used: each turn starts its CLI cold,
/// saying why, and succeeds.
#[tokio::test]
async fn a_prestarted_claude_that_died_or_whose_work_tree_changed_is_not_used() {
    let (sb, mut child, _) = first_turn_prestarted("claude").await;
    kill_prestarted(&sb, "claude");
    let second = sb.coordinator.queue_turn("scenario:complete Second", None);
    sealed_or_log(&sb, &mut child, &second).await;
    wait_starts(&sb, "claude", 4).await;
    super::harvest::advance_remote(&sb, "CLAUDE.md");
    let third = sb.coordinator.queue_turn("scenario:complete Third", None);
    let snap = sealed_or_log(&sb, &mut child, &third).await;
    wait_starts(&sb, "claude", 6).await;
    sb.coordinator.end_session();
    let (status, output) = child.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    for run in [&second, &third] {
        assert_eq!(sealed(&snap, run).status.as_str(), "succeeded", "{run}");
    }
    let log = log(&sb, "claude");
    let starts = records(&log, "start");
    let turns = records(&log, "turn");
    assert_eq!(starts.len(), 6, "{log:?}");
    assert_eq!(turns.len(), 3, "{log:?}");
    assert_eq!(turns[1]["pid"], starts[2]["pid"], "turn 2 started cold");
    assert_eq!(turns[2]["pid"], starts[4]["pid"], "turn 3 started cold");
    assert!(records(&log, "turn_file").is_empty(), "{log:?}");
    assert!(output.contains("it exited before its turn"), "{output}");
    assert!(
        output.contains("the workspace sync changed the work tree it was started in"),
        "{output}"
    );
    assert_group_gone(&sb, "claude");
}

#[tokio::test]
async fn a_missing_cli_is_agent_spawn_failed() {
    let sb = Sandbox::start(opts("scenario:complete x")).await;
    let (body, _) = one_failed_turn(
        &sb,
        agent_runner(&sb, "claude").env("HOSTED_BOOT_AGENT_COMMAND", "/nonexistent/claude"),
    )
    .await;
    assert_eq!(error_code(&body), "agent_spawn_failed");
}

#[tokio::test]
async fn agent_env_refuses_orizu_names() {
    let sb = Sandbox::start(opts("x")).await;
    let mut cmd = agent_runner(&sb, "claude");
    cmd.args(["--agent-env", "ORIZU_MODEL=x"]);
    let (status, output) = Runner::spawn(&mut cmd).finish().await;
    assert_eq!(status.code(), Some(2), "{output}");
    assert!(output.contains("ORIZU_MODEL"), "{output}");
    assert!(sb.coordinator.requests().is_empty());
}

// ------------------------------------------------- overload continuation

/// Runs one turn of `scenario` with `agent`; returns the seal, the
/// continuation events and how many times the CLI ran a turn.
async fn overload_turn(agent: &str, cli: &str, scenario: &str) -> (FinishBody, usize, usize) {
    let sb = Sandbox::start(opts(&format!("scenario:{scenario} Work"))).await;
    let mut child = Runner::spawn(&mut agent_runner(&sb, agent));
    let snap = sealed_or_log(&sb, &mut child, "run-1").await;
    sb.coordinator.end_session();
    let _ = child.finish().await;
    let body = sealed(&snap, "run-1");
    let continued = events(&snap, "run-1", "hosted_boot.overload_continuation");
    for (i, e) in continued.iter().enumerate() {
        assert_eq!(e["attempt"], i + 1);
        assert_eq!(e["agentSessionId"], json!(body.agent_session_id));
    }
    let log = log(&sb, cli);
    let turns = records(&log, "turn");
    for t in turns.iter().skip(1) {
        assert!(
            t["prompt"]
                .as_str()
                .unwrap()
                .contains("Continue the same task from its current state"),
            "{t}"
        );
        assert_eq!(t["session"], turns[0]["session"]);
    }
    (body, continued.len(), turns.len())
}

#[tokio::test]
async fn claude_overload_without_effects_is_continued_at_most_twice() {
    let (once, c1, t1) = overload_turn("claude", "claude", "overloaded-once").await;
    assert_eq!((once.status.as_str(), c1, t1), ("succeeded", 1, 2));
    // Usage is summed over the attempts.
    assert_eq!(usage(&once)["inputTokens"], 200);
    let (always, c2, t2) = overload_turn("claude", "claude", "overloaded-always").await;
    assert_eq!(
        (error_code(&always).as_str(), c2, t2),
        ("provider_overloaded", 2, 3)
    );
    let (tool, c3, t3) = overload_turn("claude", "claude", "overloaded-after-tool").await;
    assert_eq!(
        (error_code(&tool).as_str(), c3, t3),
        ("provider_overloaded", 0, 1)
    );
}

#[tokio::test]
async fn codex_and_opencode_overloads_without_effects_are_continued() {
    let (codex, c1, t1) = overload_turn("codex", "codex", "overloaded-once").await;
    assert_eq!((codex.status.as_str(), c1, t1), ("succeeded", 1, 2));
    let (oc, c2, t2) = overload_turn("opencode", "opencode", "overloaded-once").await;
    assert_eq!((oc.status.as_str(), c2, t2), ("succeeded", 1, 2));
}

// ------------------------------------------------------------------- codex

#[tokio::test]
async fn codex_app_server_completes_and_resumes_with_per_turn_usage() {
    let sb = Sandbox::start(CoordinatorOptions {
        model: Some("gpt-5-codex".into()),
        reasoning_effort: Some("high".into()),
        ..opts("scenario:complete Fix the bug")
    })
    .await;
    let mut cmd = agent_runner(&sb, "codex");
    cmd.env("CODEX_SANDBOX", "seatbelt");
    let snap = two_turns(&sb, cmd, "scenario:complete Now the tests").await;
    let log = log(&sb, "codex");
    let thread = records(&log, "turn")[0]["session"]
        .as_str()
        .unwrap()
        .to_string();
    let expected_usage = json!({"model": "gpt-5-codex", "inputTokens": 1000,
                                "outputTokens": 300, "cacheReadTokens": 200});
    for run in ["run-1", "run-2"] {
        let body = sealed(&snap, run);
        assert_eq!(body.status.as_str(), "succeeded", "{run}");
        assert_eq!(body.agent_session_id.as_deref(), Some(thread.as_str()));
        // The second turn's thread total includes the first: not reported.
        assert_eq!(usage(&body), expected_usage, "{run}");
        assert!(events(&snap, run, "item/agentMessage/delta").is_empty());
        assert_eq!(events(&snap, run, "turn/completed").len(), 1);
    }
    assert_eq!(
        events(&snap, "run-1", "hosted_boot.runner")[0]["cliVersion"],
        "codex-cli 0.152.0"
    );
    let starts = records(&log, "start");
    assert_eq!(starts[0]["argv"], json!(["app-server"]));
    assert_eq!(starts[0]["env"]["OPENAI_API_KEY"], PLACEHOLDER);
    assert_eq!(starts[0]["env"].get("CODEX_SANDBOX"), None);
    let methods: Vec<&str> = records(&log, "stdin")
        .iter()
        .filter(|r| r["run"] == "run-2")
        .map(|r| r["message"]["method"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        methods,
        vec!["initialize", "initialized", "thread/resume", "turn/start"]
    );
    assert_eq!(records(&log, "turn")[1]["effort"], "high");
}

#[tokio::test]
async fn codex_is_interrupted_with_turn_interrupt() {
    let turn = interrupted_turn(&CODEX, "scenario:interrupt Long").await;
    let got = records(&turn.log, "interrupt_received");
    assert_eq!(got[0]["params"]["turnId"], "turn-1");
    assert_eq!(records(&turn.log, "exit")[0]["code"], 0);
}

#[tokio::test]
async fn codex_ignoring_the_interrupt_is_stopped_by_signals() {
    interrupted_turn(&CODEX, "scenario:ignore-interrupt Long").await;
}

#[tokio::test]
async fn codex_lingering_after_turn_completed_is_stopped_and_silence_is_hung() {
    lingering_turn(&CODEX, "scenario:hang-after-completed Quick").await;
    silent_turn_is_hung(&CODEX).await;
}

#[tokio::test]
async fn codex_declines_approval_requests() {
    let sb = Sandbox::start(opts("scenario:approval Risky")).await;
    let mut child = Runner::spawn(&mut agent_runner(&sb, "codex"));
    let snap = sealed_or_log(&sb, &mut child, "run-1").await;
    sb.coordinator.end_session();
    let _ = child.finish().await;
    assert_eq!(sealed(&snap, "run-1").status.as_str(), "succeeded");
    let log = log(&sb, "codex");
    let answer = &records(&log, "approval_answer")[0]["answer"];
    assert_eq!(answer["id"], 90);
    assert_eq!(answer["result"]["decision"], "decline");
}

/// A connector value the `forge` scenarios of the stand-ins spell in event
/// types (raw, and for Codex also with JSON escapes).
const FORGE_KEY: (&str, &str) = ("ACME_API_KEY", "acme-0123456789-abcdefghij");

/// Runs the `forge` scenario of `agent` (the stand-in reads the connector
/// value named by `FORGE_SECRET`) to its seal; the stored events of
/// `run-1`, the stand-in's turn record and the secrets to look for.
async fn forge_turn(agent: &str, cli: &str) -> (Vec<hosted_boot::wire::Event>, Value, Vec<String>) {
    let sb = Sandbox::start(CoordinatorOptions {
        connectors: vec![(FORGE_KEY.0.into(), FORGE_KEY.1.into())],
        ..opts("scenario:forge Go")
    })
    .await;
    let mut cmd = agent_runner(&sb, agent);
    cmd.env("FORGE_SECRET", FORGE_KEY.0);
    if agent == "opencode" {
        cmd.env("ORIZU_OPENCODE_PORT", free_port().to_string());
    }
    let mut child = Runner::spawn(&mut cmd);
    let snap = sealed_or_log(&sb, &mut child, "run-1").await;
    sb.coordinator.end_session();
    let (status, output) = child.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_eq!(sealed(&snap, "run-1").status.as_str(), "succeeded");
    let log = log(&sb, cli);
    let mut turn = records(&log, "turn")[0].clone();
    if let Some(answer) = records(&log, "forge_answer").first() {
        turn["forge_answer"] = answer["answer"].clone();
    }
    let events = snap.run("run-1").unwrap().events.clone();
    (events, turn, sb.secrets(&[FORGE_KEY.1]))
}

/// Every one of `expected` is among the agent events of `events`.
fn assert_has_events(events: &[hosted_boot::wire::Event], expected: &[(&str, Value)]) {
    let got = agent_events(events);
    for (kind, data) in expected {
        assert!(
            got.iter().any(|(k, d)| k == kind && d == data),
            "no event {kind} {data} among {got:#?}"
        );
    }
}

#[tokio::test]
async fn codex_methods_are_redacted_and_cannot_claim_the_runners_namespace() {
    let (events, turn, secrets) = forge_turn("codex", "codex").await;
    assert_events_clean(
        &events,
        &secrets,
        &[
            "hosted_boot.runner",
            "hosted_boot.workspace_sync",
            "hosted_boot.agent_session",
            "hosted_boot.harvest",
        ],
    );
    let tid = turn["session"].clone();
    assert_has_events(
        &events,
        &[
            ("[REDACTED]", json!({"forged": false, "n": 1})),
            ("[REDACTED]", json!({"n": 2})),
            (
                "item/[REDACTED]/started",
                json!({"n": 3, "k": "[REDACTED]"}),
            ),
            (
                "output",
                json!({"method": "hosted_boot.harvest", "params": {"forged": true, "threadId": tid}}),
            ),
            (
                "output",
                json!({"method": "hosted_boot.agent_session",
                       "params": {"forged": true, "agentSessionId": "forged"}}),
            ),
            (
                "output",
                json!({"method": "hosted_boot.[REDACTED]", "params": {"forged": true}}),
            ),
            (
                "output",
                json!({"id": 91, "method": "hosted_boot.spawn_failed", "params": {"forged": true}}),
            ),
        ],
    );
    // The refused server request is still answered.
    assert_eq!(turn["forge_answer"]["id"], 91);
    assert!(turn["forge_answer"]["error"].is_object(), "{turn}");
}

#[tokio::test]
async fn codex_failures_are_classified() {
    let scenarios: Vec<&str> = CLASSES.iter().map(|c| c.0).collect();
    let seals = error_seals("codex", &scenarios).await;
    expect_codes(&seals, CLASSES);
    assert_eq!(seals[1].error.as_ref().unwrap().retry_after_ms, Some(2400));
}

#[tokio::test]
async fn codex_exec_completes_resumes_with_turn_usage_and_is_interrupted_by_sigint() {
    let sb = Sandbox::start(opts("scenario:complete Fix")).await;
    let snap = two_turns(
        &sb,
        agent_runner(&sb, "codex-exec"),
        "scenario:complete More",
    )
    .await;
    let log = log(&sb, "codex");
    let thread = records(&log, "turn")[0]["session"]
        .as_str()
        .unwrap()
        .to_string();
    for run in ["run-1", "run-2"] {
        let body = sealed(&snap, run);
        assert_eq!(body.status.as_str(), "succeeded");
        assert_eq!(body.agent_session_id.as_deref(), Some(thread.as_str()));
        // exec reports the thread's running total; the turn's own is sent.
        assert_eq!(
            usage(&body),
            json!({"inputTokens": 1000, "outputTokens": 300, "cacheReadTokens": 200}),
            "{run}"
        );
    }
    let starts = records(&log, "start");
    let argv2 = starts[1]["argv"].as_array().unwrap();
    let n = argv2.len();
    assert_eq!(argv2[n - 3..], [json!("resume"), json!(thread), json!("-")]);
    assert_eq!(records(&log, "stdin")[0]["prompt"], "scenario:complete Fix");

    let sb = Sandbox::start(opts("scenario:interrupt Long")).await;
    let mut child = Runner::spawn(&mut agent_runner(&sb, "codex-exec"));
    wait_event(&sb, "run-1", "item.completed").await;
    sb.coordinator.interrupt(Some("run-1")).unwrap();
    let snap = sealed_or_log(&sb, &mut child, "run-1").await;
    sb.coordinator.end_session();
    let _ = child.finish().await;
    // codex exec exits 1 after its SIGINT: the runner decides.
    assert_eq!(sealed(&snap, "run-1").status.as_str(), "interrupted");
    assert_eq!(records(&self::log(&sb, "codex"), "sigint").len(), 1);

    let sb = Sandbox::start(opts("scenario:quota Go")).await;
    let (body, _) = one_failed_turn(&sb, &mut agent_runner(&sb, "codex-exec")).await;
    assert_eq!(error_code(&body), "provider_quota_exhausted");
}

// ---------------------------------------------------------------- opencode

fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn opencode_serve_completes_and_resumes_on_the_configured_port() {
    let port = free_port();
    let sb = Sandbox::start(CoordinatorOptions {
        model: Some("anthropic/claude-sonnet-4-5".into()),
        ..opts("scenario:permission Build it")
    })
    .await;
    let mut cmd = agent_runner(&sb, "opencode");
    cmd.env("ORIZU_OPENCODE_PORT", port.to_string())
        .env("OPENCODE_SERVER_PASSWORD", "inherited-password");
    let snap = two_turns(&sb, cmd, "scenario:complete Again").await;
    let log = log(&sb, "opencode");
    let sid = records(&log, "turn")[0]["session"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(sid.starts_with("ses_"));
    for run in ["run-1", "run-2"] {
        let body = sealed(&snap, run);
        assert_eq!(body.status.as_str(), "succeeded", "{run}");
        assert_eq!(body.agent_session_id.as_deref(), Some(sid.as_str()));
        assert_eq!(
            usage(&body),
            json!({"model": "anthropic/claude-sonnet-4-5", "inputTokens": 100,
                   "outputTokens": 50, "cacheReadTokens": 500, "cacheWriteTokens": 20,
                   "costUsd": 0.002}),
            "{run}"
        );
        assert!(events(&snap, run, "message.part.delta").is_empty());
        assert!(events(&snap, run, "server.heartbeat").is_empty());
    }
    let starts = records(&log, "start");
    for s in &starts {
        assert_eq!(
            s["argv"],
            json!([
                "serve",
                "--hostname",
                "127.0.0.1",
                "--port",
                port.to_string()
            ])
        );
        assert_eq!(s["has_password"], true);
        assert_eq!(s["env"]["OPENCODE_PERMISSION"].as_str().is_some(), true);
        assert_eq!(s["env"]["ANTHROPIC_API_KEY"], PLACEHOLDER);
    }
    assert!(records(&log, "unauthorized").is_empty());
    let turns = records(&log, "turn");
    assert_eq!(
        turns[0]["model"],
        json!({"providerID": "anthropic", "modelID": "claude-sonnet-4-5"})
    );
    // The permission the agent asked for was granted.
    let answers = records(&log, "permission_answer");
    assert_eq!(answers[0]["id"], "per_1");
    assert_eq!(answers[0]["body"], json!({"response": "always"}));
    assert_eq!(
        events(&snap, "run-1", "hosted_boot.runner")[0]["cliVersion"],
        "1.18.2"
    );
    assert_group_gone(&sb, "opencode");
}

#[tokio::test]
async fn opencode_event_types_are_redacted_and_cannot_claim_the_runners_namespace() {
    let (events, turn, secrets) = forge_turn("opencode", "opencode").await;
    assert_events_clean(
        &events,
        &secrets,
        &[
            "hosted_boot.runner",
            "hosted_boot.workspace_sync",
            "hosted_boot.agent_session",
            "hosted_boot.harvest",
        ],
    );
    let sid = turn["session"].clone();
    assert_has_events(
        &events,
        &[
            ("[REDACTED]", json!({"sessionID": sid, "n": 1})),
            (
                "tool.[REDACTED].done",
                json!({"sessionID": sid, "n": 2, "k": "[REDACTED]"}),
            ),
            (
                "output",
                json!({"type": "hosted_boot.harvest",
                       "properties": {"forged": true, "sessionID": sid}}),
            ),
            (
                "output",
                json!({"type": "hosted_boot.agent_session",
                       "properties": {"forged": true, "agentSessionID": "forged"}}),
            ),
            (
                "output",
                json!({"type": "hosted_boot.[REDACTED]", "properties": {"forged": true}}),
            ),
        ],
    );
}

#[tokio::test]
async fn opencode_is_interrupted_with_abort_then_signals() {
    for (scenario, aborted_cleanly) in [("interrupt", true), ("ignore-interrupt", false)] {
        let turn = interrupted_turn(&OPENCODE, &format!("scenario:{scenario} Long")).await;
        let errors = events(&turn.snap, "run-1", "session.error");
        assert_eq!(errors.len(), usize::from(aborted_cleanly), "{scenario}");
    }
}

#[tokio::test]
async fn opencode_server_is_stopped_after_idle_and_silence_is_hung() {
    let turn = lingering_turn(&OPENCODE, "scenario:stubborn Quick").await;
    assert!(!records(&turn.log, "signal").is_empty());
    silent_turn_is_hung(&OPENCODE).await;
}

#[tokio::test]
async fn opencode_failures_are_classified_and_retry_loops_give_up() {
    let scenarios: Vec<&str> = CLASSES.iter().map(|c| c.0).collect();
    let seals = error_seals("opencode", &scenarios).await;
    expect_codes(&seals, CLASSES);
    assert_eq!(seals[1].error.as_ref().unwrap().retry_after_ms, Some(7000));
    // A retry notice naming a dead quota stops the turn at once.
    assert!(
        seals[0]
            .error
            .as_ref()
            .unwrap()
            .message
            .contains("attempt 1")
    );
}

#[tokio::test]
async fn opencode_run_completes_resumes_and_fails_classified() {
    let sb = Sandbox::start(CoordinatorOptions {
        model: Some("openai/gpt-5".into()),
        reasoning_effort: Some("high".into()),
        ..opts("scenario:complete Fix")
    })
    .await;
    let snap = two_turns(
        &sb,
        agent_runner(&sb, "opencode-run"),
        "scenario:no-done More",
    )
    .await;
    let log = log(&sb, "opencode");
    let sid = records(&log, "turn")[0]["session"]
        .as_str()
        .unwrap()
        .to_string();
    for run in ["run-1", "run-2"] {
        let body = sealed(&snap, run);
        assert_eq!(body.status.as_str(), "succeeded", "{run}");
        assert_eq!(body.agent_session_id.as_deref(), Some(sid.as_str()));
        assert_eq!(usage(&body)["costUsd"], 0.002);
    }
    let starts = records(&log, "start");
    assert_eq!(
        starts[1]["argv"],
        json!([
            "run",
            "--format",
            "json",
            "--auto",
            "--session",
            sid,
            "-m",
            "openai/gpt-5",
            "--variant",
            "high"
        ])
    );
    assert_eq!(starts[0]["env"]["OPENAI_API_KEY"], PLACEHOLDER);

    let sb = Sandbox::start(opts("scenario:auth Go")).await;
    let (body, _) = one_failed_turn(&sb, &mut agent_runner(&sb, "opencode-run")).await;
    assert_eq!(error_code(&body), "provider_auth");
}
