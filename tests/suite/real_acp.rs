//! The `acp` adapter against real ACP agents: the real binary with
//! `--agent acp --agent-command claude-agent-acp` (Claude Code's agent for
//! the Agent Client Protocol) or `codex-acp` (Codex's), both pinned in
//! `tools/agent-clis/package.json` and installed by
//! `scripts/install-agent-clis`, against the reference coordinator and the
//! fake model provider of the real-CLI tests (`tests/fakes/model-provider`:
//! the prompt names the scenario). Each scenario runs for both agents.

use std::path::Path;
use std::time::Duration;

use hosted_boot_coordinator::{CoordinatorOptions, Snapshot};
use tokio::process::Command;

use super::real_clis::{
    Provider, Runner, TURN_WAIT, assert_nothing_left, error_code, events, installed, sealed,
    tool_started, usage, users,
};
use super::support::Sandbox;

/// The real ACP agents under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Agent {
    /// `@agentclientprotocol/claude-agent-acp`.
    Claude,
    /// `@agentclientprotocol/codex-acp`.
    Codex,
    /// `@google/gemini-cli`'s `--acp` mode.
    Gemini,
}

impl Agent {
    /// Its program, as installed.
    fn program(self) -> &'static str {
        match self {
            Agent::Claude => "claude-agent-acp",
            Agent::Codex => "codex-acp",
            Agent::Gemini => GEMINI,
        }
    }

    /// The session's model: a value the agent's model option offers, so
    /// that the runner sets it (PROTOCOL.md 7). Claude Code's agent offers
    /// aliases; Codex's offers its catalogue and the model of its
    /// config.toml, which is the fake provider's (a model of the catalogue
    /// makes Codex declare its tools in a way the fake does not answer).
    /// Gemini CLI's is its own: it offers models, not a model option.
    fn model(self) -> Option<&'static str> {
        match self {
            Agent::Claude => Some("sonnet"),
            Agent::Codex => Some("gpt-fake"),
            Agent::Gemini => None,
        }
    }
}

pub(super) struct Case {
    pub(super) sb: Sandbox,
    pub(super) provider: Provider,
    agent: Agent,
    program: std::path::PathBuf,
    /// Codex's home (its config.toml names the fake provider); in the
    /// build's temporary directory, as Codex refuses its helper links
    /// under /tmp.
    codex_home: tempfile::TempDir,
}

impl Case {
    pub(super) async fn start(agent: Agent, task: &str) -> Option<Case> {
        Case::start_from(
            agent,
            CoordinatorOptions {
                task: task.into(),
                ..CoordinatorOptions::default()
            },
        )
        .await
    }

    /// As [`Case::start`], the coordinator's other options from `opts`.
    pub(super) async fn start_from(agent: Agent, opts: CoordinatorOptions) -> Option<Case> {
        let bin = installed(agent.program())?;
        let sb = Sandbox::start(CoordinatorOptions {
            model: agent.model().map(String::from),
            reasoning_effort: Some("high".into()),
            ..opts
        })
        .await;
        let provider = Provider::start(sb.dir.path());
        let codex_home = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        std::fs::write(
            codex_home.path().join("config.toml"),
            format!(
                "model = \"gpt-fake\"\nmodel_provider = \"fake\"\n\
                 [model_providers.fake]\nname = \"fake\"\nbase_url = \"{}/v1\"\n\
                 env_key = \"OPENAI_API_KEY\"\nwire_api = \"responses\"\n\
                 request_max_retries = 0\nstream_max_retries = 0\n",
                provider.url()
            ),
        )
        .unwrap();
        if agent == Agent::Gemini {
            let home = sb.dir.path().join(".gemini");
            std::fs::create_dir_all(&home).unwrap();
            std::fs::write(home.join("settings.json"), GEMINI_SETTINGS).unwrap();
        }
        Some(Case {
            sb,
            provider,
            agent,
            program: bin.join(agent.program()),
            codex_home,
        })
    }

    /// The runner with this case's agent, configured as a platform would
    /// configure it: its provider's key and address in the environment
    /// (Codex's in its CODEX_HOME).
    pub(super) fn command(&self) -> Command {
        let mut cmd = self.sb.command("run", Path::new("/nonexistent"));
        cmd.env("HOSTED_BOOT_AGENT", "acp")
            .env("HOSTED_BOOT_AGENT_COMMAND", &self.program)
            .args(["--agent-idle-timeout", "0"]);
        match self.agent {
            Agent::Claude => {
                cmd.env("ANTHROPIC_API_KEY", "test-key")
                    .args([
                        "--agent-env",
                        &format!("ANTHROPIC_BASE_URL={}", self.provider.url()),
                    ])
                    .args(["--agent-env", "DISABLE_TELEMETRY=1"])
                    .args(["--agent-env", "DISABLE_AUTOUPDATER=1"])
                    .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
                    .env("CLAUDE_CODE_MAX_RETRIES", "0");
            }
            Agent::Codex => {
                cmd.env("CODEX_HOME", self.codex_home.path())
                    .env("OPENAI_API_KEY", "test-key");
            }
            Agent::Gemini => {
                cmd.args(["--agent-arg", "--acp"])
                    .env("GEMINI_API_KEY", "test-key")
                    .args([
                        "--agent-env",
                        &format!("GOOGLE_GEMINI_BASE_URL={}", self.provider.url()),
                    ])
                    // Else it refuses to run in an untrusted folder.
                    .args(["--agent-env", "GEMINI_CLI_TRUST_WORKSPACE=true"]);
            }
        }
        cmd
    }

    pub(super) fn repo(&self) -> std::path::PathBuf {
        std::fs::canonicalize(self.sb.root()).unwrap().join("repo")
    }

    fn pushed(&self, name: &str) -> Option<String> {
        self.sb.remote_file(name)
    }

    pub(super) async fn sealed(&self, runner: &mut Runner, run: &str) -> Snapshot {
        let got = self
            .sb
            .coordinator
            .wait_for(TURN_WAIT, |s| {
                s.run(run).is_some_and(|r| r.finish.is_some())
            })
            .await;
        match got {
            Ok(snap) => snap,
            Err(e) => {
                let _ = runner.child.start_kill();
                super::real_clis::kill_leftovers(&self.sb.root());
                panic!("{run} was not sealed: {e:?}\nrunner:\n{}", runner.output());
            }
        }
    }
}

/// Four turns through the ACP agent: a write; a second that loads the
/// first's session (`session/load`); a third interrupted mid-tool
/// (`session/cancel`, then the tree stopped); a fourth after the interrupt.
/// The agent's updates become events (a message joined from its chunks, the
/// tool calls), its usage the turn's, and nothing is left running.
async fn four_turns(agent: Agent) {
    let Some(case) = Case::start(agent, "write:one.txt").await else {
        return;
    };
    let mut runner = Runner::spawn(&mut case.command());

    let snap = case.sealed(&mut runner, "run-1").await;
    let first = sealed(&snap, "run-1");
    assert_eq!(
        first.status.as_str(),
        "succeeded",
        "{first:?}\n{}",
        runner.output()
    );
    let sid = first.agent_session_id.clone().expect("an agent session id");
    let turn1 = case.provider.turn_requests(0);
    assert_eq!(turn1.len(), 2, "a tool call, then the final message");
    assert!(
        turn1[0]["model"]
            .as_str()
            .is_some_and(|m| agent.model().is_none_or(|want| m.contains(want))),
        "the model option was not set: {}",
        turn1[0]["model"]
    );
    let u = usage(&first);
    assert_eq!(u["inputTokens"], 200, "{u}");
    assert_eq!(u["outputTokens"], 20, "{u}");
    assert_eq!(case.pushed("one.txt").as_deref(), Some("done"));
    let messages = events(&snap, "run-1", "agent_message_chunk");
    assert!(
        messages
            .iter()
            .any(|m| m["text"].as_str().is_some_and(|t| !t.is_empty())),
        "no joined message: {messages:?}"
    );
    assert!(!events(&snap, "run-1", "tool_call").is_empty());

    // Turn 2 loads turn 1's session: the provider sees turn 1's prompt.
    let seen = case.provider.requests().len();
    assert_eq!(
        case.sb.coordinator.queue_turn("write:two.txt", None),
        "run-2"
    );
    let snap = case.sealed(&mut runner, "run-2").await;
    let second = sealed(&snap, "run-2");
    assert_eq!(second.status.as_str(), "succeeded", "{second:?}");
    assert_eq!(second.agent_session_id.as_deref(), Some(sid.as_str()));
    let turn2 = case.provider.turn_requests(seen);
    assert_eq!(turn2.len(), 2, "{turn2:?}");
    assert!(
        users(&turn2[0]).contains("write:one.txt"),
        "turn 2 did not load turn 1's session: {}",
        users(&turn2[0])
    );
    // The history session/load replays is not turn 2's.
    assert!(
        !events(&snap, "run-2", "user_message_chunk")
            .iter()
            .any(|e| e.to_string().contains("write:one.txt")),
        "turn 1's history was forwarded as turn 2's events"
    );
    assert_eq!(usage(&second)["inputTokens"], 200);
    assert_eq!(case.pushed("two.txt").as_deref(), Some("done"));

    // Turn 3 is interrupted while its tool runs.
    assert_eq!(
        case.sb.coordinator.queue_turn("sleep:started.txt", None),
        "run-3"
    );
    tool_started(&case.repo().join("started.txt"), &runner).await;
    case.sb.coordinator.interrupt(Some("run-3")).unwrap();
    let snap = case.sealed(&mut runner, "run-3").await;
    let third = sealed(&snap, "run-3");
    assert_eq!(third.status.as_str(), "interrupted", "{third:?}");
    assert_nothing_left(&case.repo()).await;

    // Turn 4 after the interrupt, in the same session.
    let seen = case.provider.requests().len();
    assert_eq!(
        case.sb.coordinator.queue_turn("write:four.txt", None),
        "run-4"
    );
    let snap = case.sealed(&mut runner, "run-4").await;
    let fourth = sealed(&snap, "run-4");
    assert_eq!(fourth.status.as_str(), "succeeded", "{fourth:?}");
    assert_eq!(fourth.agent_session_id.as_deref(), Some(sid.as_str()));
    assert_eq!(case.provider.turn_requests(seen).len(), 2);
    assert_eq!(case.pushed("four.txt").as_deref(), Some("done"));

    case.sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_nothing_left(&case.sb.root()).await;
}

#[tokio::test]
async fn real_claude_acp_four_turns() {
    four_turns(Agent::Claude).await;
}

#[tokio::test]
async fn real_codex_acp_four_turns() {
    four_turns(Agent::Codex).await;
}

/// A provider error fails the turn with the class the agent's error says,
/// or `agent_crashed` / `provider_limit_unknown` when it says none.
async fn provider_error(agent: Agent, kind: &str, codes: &[&str]) {
    let Some(case) = Case::start(agent, &format!("fail:{kind}")).await else {
        return;
    };
    let mut runner = Runner::spawn(&mut case.command());
    let snap = case.sealed(&mut runner, "run-1").await;
    let body = sealed(&snap, "run-1");
    assert_eq!(body.status.as_str(), "failed", "{body:?}");
    let code = error_code(&body);
    assert!(
        codes.contains(&code.as_str()),
        "{kind}: {code} ({:?})\n{}",
        body.error,
        runner.output()
    );
    // A retryable class leaves the boot waiting for the next turn; the
    // others end it (turn_failed).
    case.sb.coordinator.end_session();
    runner.finish().await;
    assert_nothing_left(&case.sb.root()).await;
}

#[tokio::test]
async fn real_claude_acp_auth_error() {
    provider_error(Agent::Claude, "401", &["provider_auth"]).await;
}

#[tokio::test]
async fn real_claude_acp_rate_limit() {
    provider_error(
        Agent::Claude,
        "429",
        &["provider_rate_limited", "provider_limit_unknown"],
    )
    .await;
}

#[tokio::test]
async fn real_claude_acp_overload() {
    provider_error(Agent::Claude, "529", &["provider_overloaded"]).await;
}

#[tokio::test]
async fn real_codex_acp_auth_error() {
    provider_error(Agent::Codex, "401", &["provider_auth"]).await;
}

/// Codex says "exceeded retry limit, last status: 429": a bare 429 is
/// not taken for a plain rate limit (PROTOCOL.md 7).
#[tokio::test]
async fn real_codex_acp_rate_limit() {
    provider_error(Agent::Codex, "429", &["provider_limit_unknown"]).await;
}

#[tokio::test]
async fn real_codex_acp_overload() {
    provider_error(Agent::Codex, "529", &["provider_overloaded"]).await;
}

/// SIGTERM mid-turn: the run sealed `interrupted`, the runner exits 143,
/// nothing left running.
async fn sigterm_mid_turn(agent: Agent) {
    let Some(case) = Case::start(agent, "sleep:started.txt").await else {
        return;
    };
    let runner = Runner::spawn(&mut case.command());
    tool_started(&case.repo().join("started.txt"), &runner).await;
    super::support::signal(runner.pid(), rustix::process::Signal::TERM);
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(143), "{output}");
    let snap = case.sb.coordinator.snapshot();
    assert_eq!(sealed(&snap, "run-1").status.as_str(), "interrupted");
    assert_nothing_left(&case.sb.root()).await;
}

#[tokio::test]
async fn real_claude_acp_sigterm_mid_turn() {
    sigterm_mid_turn(Agent::Claude).await;
}

#[tokio::test]
async fn real_codex_acp_sigterm_mid_turn() {
    sigterm_mid_turn(Agent::Codex).await;
}

/// Writes Claude Code's settings with its bypass mode disabled (so none
/// is offered to set), so that its agent asks before a tool.
fn claude_asks(case: &Case) {
    let settings = case.sb.dir.path().join(".claude");
    std::fs::create_dir_all(&settings).unwrap();
    std::fs::write(
        settings.join("settings.json"),
        r#"{"permissions": {"defaultMode": "default", "disableBypassPermissionsMode": "disable"}}"#,
    )
    .unwrap();
}

/// An agent that asks before a tool: the permission request is an event
/// that carries the answer, granted once, and the tool runs. (Codex's
/// agent never asked in these scenarios: PROTOCOL.md 7.)
#[tokio::test]
async fn real_claude_acp_permission_request_is_granted() {
    let Some(case) = Case::start(Agent::Claude, "write:one.txt").await else {
        return;
    };
    claude_asks(&case);
    let mut runner = Runner::spawn(&mut case.command());
    let snap = case.sealed(&mut runner, "run-1").await;
    let first = sealed(&snap, "run-1");
    assert_eq!(first.status.as_str(), "succeeded", "{first:?}");
    let asked = events(&snap, "run-1", "session/request_permission");
    assert!(!asked.is_empty(), "{}", runner.output());
    assert!(
        asked
            .iter()
            .all(|a| a["runnerAnswer"]["outcome"]["outcome"] == "selected"),
        "{asked:?}"
    );
    assert_eq!(case.pushed("one.txt").as_deref(), Some("done"));
    // Granted once, never always: no rule written into the repository.
    assert_eq!(case.pushed(".claude/settings.local.json"), None);
    assert!(!case.repo().join(".claude").exists());
    case.sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_nothing_left(&case.sb.root()).await;
}

/// `HOSTED_BOOT_ACP_PERMISSIONS=reject`: the request is refused (an event
/// with the answer), the tool does not run, and the agent ends its turn.
#[tokio::test]
async fn real_claude_acp_permission_request_is_rejected() {
    let Some(case) = Case::start(Agent::Claude, "write:one.txt").await else {
        return;
    };
    claude_asks(&case);
    let mut runner = Runner::spawn(case.command().env("HOSTED_BOOT_ACP_PERMISSIONS", "reject"));
    let snap = case.sealed(&mut runner, "run-1").await;
    let first = sealed(&snap, "run-1");
    assert_eq!(first.status.as_str(), "succeeded", "{first:?}");
    let asked = events(&snap, "run-1", "session/request_permission");
    assert!(!asked.is_empty(), "{}", runner.output());
    for a in &asked {
        let picked = a["runnerAnswer"]["outcome"]["optionId"]
            .as_str()
            .unwrap_or("");
        let kind = a["options"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|o| o["optionId"] == picked)
            .map(|o| o["kind"].clone());
        assert_eq!(kind, Some(serde_json::json!("reject_once")), "{a}");
    }
    assert!(!case.repo().join("one.txt").exists());
    assert_eq!(case.pushed("one.txt"), None);
    case.sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_nothing_left(&case.sb.root()).await;
}

/// With `--prestart-agent on` the ACP agent for turn 2 is started while the
/// runner waits for that turn: it sends the provider nothing before its
/// prompt (nothing for two seconds after it was started), turn 2 loads
/// turn 1's session in that process, and the one started for turn 3 goes
/// when the session ends.
async fn prestarted_sends_nothing_before_its_turn(agent: Agent) {
    let Some(case) = Case::start(agent, "write:one.txt").await else {
        return;
    };
    let mut runner = Runner::spawn(case.command().args(["--prestart-agent", "on"]));
    let snap = case.sealed(&mut runner, "run-1").await;
    let sid = sealed(&snap, "run-1")
        .agent_session_id
        .expect("an agent session id");
    let deadline = std::time::Instant::now() + TURN_WAIT;
    while !runner
        .output()
        .contains("agent pre-started for the next turn")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no agent was pre-started:\n{}",
            runner.output()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seen = case.provider.requests().len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        case.provider.requests().len(),
        seen,
        "the pre-started agent called the provider before its turn"
    );
    assert_eq!(
        case.sb.coordinator.queue_turn("write:two.txt", None),
        "run-2"
    );
    let snap = case.sealed(&mut runner, "run-2").await;
    let second = sealed(&snap, "run-2");
    assert_eq!(second.status.as_str(), "succeeded", "{second:?}");
    assert_eq!(second.agent_session_id.as_deref(), Some(sid.as_str()));
    let turn2 = case.provider.turn_requests(seen);
    assert!(
        users(&turn2[0]).contains("write:one.txt"),
        "turn 2 did not load turn 1's session: {}",
        users(&turn2[0])
    );
    assert_eq!(case.pushed("two.txt").as_deref(), Some("done"));
    assert!(
        runner
            .output()
            .contains("the turn uses the pre-started agent"),
        "{}",
        runner.output()
    );
    case.sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_nothing_left(&case.sb.root()).await;
}

#[tokio::test]
async fn real_claude_acp_prestarted_sends_nothing_before_its_turn() {
    prestarted_sends_nothing_before_its_turn(Agent::Claude).await;
}

#[tokio::test]
async fn real_codex_acp_prestarted_sends_nothing_before_its_turn() {
    prestarted_sends_nothing_before_its_turn(Agent::Codex).await;
}

// ---------------------------------------------------------------- Gemini CLI

/// Gemini CLI's program, as installed; its ACP mode is `--acp`.
const GEMINI: &str = "gemini";

/// The settings a platform gives Gemini CLI (`~/.gemini/settings.json`; a
/// system file, `GEMINI_CLI_SYSTEM_SETTINGS_PATH`, is skipped when a
/// directory above it is writable by others, as `/tmp` is): no usage
/// statistics (else it sends them to play.googleapis.com), no update
/// check, its API-key auth (GEMINI_API_KEY, GOOGLE_GEMINI_BASE_URL
/// applied), no session cleanup (at start it deletes every session file
/// that holds no conversation, and with it every file of the same session:
/// the one a `session/load` leaves, `next_minute_after`, takes the session
/// with it), and two attempts per model request instead of its ten with a
/// backoff of 5 to 30 s (a persistent 429 or 503 would take minutes).
const GEMINI_SETTINGS: &str = r#"{
  "security": {"auth": {"selectedType": "gemini-api-key"}},
  "privacy": {"usageStatisticsEnabled": false},
  "telemetry": {"enabled": false},
  "general": {"enableAutoUpdate": false, "enableAutoUpdateNotification": false,
              "sessionRetention": {"enabled": false}, "maxAttempts": 2}
}"#;

/// Gemini CLI 0.61.0's `session/load` erases the session it is asked to
/// load when it runs in the wall-clock minute the session was created in
/// (google-gemini/gemini-cli#28775: it first starts a new recording under
/// the file name of that minute and the session's id, the session's own
/// file): the load fails ("No previous sessions found for this project")
/// and the session is lost. A test that resumes a session waits for the
/// minute after its first turn.
async fn next_minute_after(sealed_at: std::time::SystemTime) {
    let minute =
        |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() / 60;
    while minute(std::time::SystemTime::now()) <= minute(sealed_at) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Four turns through Gemini CLI's ACP mode, as for Claude Code's agent:
/// a write (its `yolo` mode set, its shell tool `run_shell_command`); a
/// second that loads the first's session; a third interrupted mid-tool; a
/// fourth after it. Nothing is left running.
#[tokio::test]
async fn real_gemini_acp_four_turns() {
    let Some(case) = Case::start(Agent::Gemini, "write:one.txt").await else {
        return;
    };
    let mut runner = Runner::spawn(&mut case.command());

    let snap = case.sealed(&mut runner, "run-1").await;
    let sealed_at = std::time::SystemTime::now();
    let first = sealed(&snap, "run-1");
    assert_eq!(
        first.status.as_str(),
        "succeeded",
        "{first:?}\n{}",
        runner.output()
    );
    let sid = first.agent_session_id.clone().expect("an agent session id");
    let turn1 = case.provider.turn_requests(0);
    assert_eq!(turn1.len(), 2, "a tool call, then the final message");
    assert_eq!(turn1[0]["api"], "gemini");
    assert!(
        turn1[0]["tools"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("run_shell_command")),
        "{}",
        turn1[0]["tools"]
    );
    assert_eq!(case.pushed("one.txt").as_deref(), Some("done"));
    assert!(!events(&snap, "run-1", "tool_call").is_empty());

    // Turn 2 loads turn 1's session: the provider sees turn 1's prompt.
    next_minute_after(sealed_at).await;
    let seen = case.provider.requests().len();
    assert_eq!(
        case.sb.coordinator.queue_turn("write:two.txt", None),
        "run-2"
    );
    let snap = case.sealed(&mut runner, "run-2").await;
    let second = sealed(&snap, "run-2");
    assert_eq!(
        second.status.as_str(),
        "succeeded",
        "{second:?}\n{}",
        runner.output()
    );
    assert_eq!(second.agent_session_id.as_deref(), Some(sid.as_str()));
    let turn2 = case.provider.turn_requests(seen);
    assert_eq!(turn2.len(), 2, "{turn2:?}");
    assert!(
        users(&turn2[0]).contains("write:one.txt"),
        "turn 2 did not load turn 1's session: {}",
        users(&turn2[0])
    );
    // Unlike Claude Code's agent, Gemini CLI does not await its replay of
    // the loaded history: most of it comes after its answer to
    // `session/load`, and is forwarded as turn 2's events (README, the ACP
    // agents' table).
    assert_eq!(case.pushed("two.txt").as_deref(), Some("done"));

    // Turn 3 is interrupted while its tool runs.
    assert_eq!(
        case.sb.coordinator.queue_turn("sleep:started.txt", None),
        "run-3"
    );
    tool_started(&case.repo().join("started.txt"), &runner).await;
    case.sb.coordinator.interrupt(Some("run-3")).unwrap();
    let snap = case.sealed(&mut runner, "run-3").await;
    let third = sealed(&snap, "run-3");
    assert_eq!(third.status.as_str(), "interrupted", "{third:?}");
    assert_eq!(third.agent_session_id.as_deref(), Some(sid.as_str()));
    assert_nothing_left(&case.repo()).await;

    // Turn 4 after the interrupt, in the same session.
    let seen = case.provider.requests().len();
    assert_eq!(
        case.sb.coordinator.queue_turn("write:four.txt", None),
        "run-4"
    );
    let snap = case.sealed(&mut runner, "run-4").await;
    let fourth = sealed(&snap, "run-4");
    assert_eq!(
        fourth.status.as_str(),
        "succeeded",
        "{fourth:?}\n{}",
        runner.output()
    );
    assert_eq!(fourth.agent_session_id.as_deref(), Some(sid.as_str()));
    let turn4 = case.provider.turn_requests(seen);
    assert_eq!(turn4.len(), 2, "{turn4:?}");
    assert!(users(&turn4[0]).contains("write:two.txt"));
    assert_eq!(case.pushed("four.txt").as_deref(), Some("done"));

    case.sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_nothing_left(&case.sb.root()).await;
}

/// A bad key: the Gemini API's 400 `API_KEY_INVALID`.
#[tokio::test]
async fn real_gemini_acp_auth_error() {
    provider_error(Agent::Gemini, "401", &["provider_auth"]).await;
}

#[tokio::test]
async fn real_gemini_acp_permission_denied() {
    provider_error(Agent::Gemini, "403", &["provider_auth"]).await;
}

/// Google's per-minute 429 (its message says "exceeded your current
/// quota", as an exhausted quota's does): Gemini CLI retries it, then
/// says "Suggested retry after 1s.".
#[tokio::test]
async fn real_gemini_acp_rate_limit() {
    provider_error(Agent::Gemini, "429", &["provider_rate_limited"]).await;
}

/// Google's per-day 429: "You have exhausted your daily quota on this
/// model.", not retried.
#[tokio::test]
async fn real_gemini_acp_quota() {
    provider_error(Agent::Gemini, "quota", &["provider_quota_exhausted"]).await;
}

/// Google's 503 UNAVAILABLE "The model is overloaded." on a second turn,
/// a minute after the first (`next_minute_after`): `provider_overloaded`.
/// The overload continuation does not follow: the history Gemini CLI
/// replays after its answer to `session/load` holds the first turn's tool
/// call, which counts as this turn's (on a session's first turn the
/// continuation would load the session in the minute it was created, erase
/// it, and end the turn `resume_failed`).
#[tokio::test]
async fn real_gemini_acp_overload() {
    let Some(case) = Case::start(Agent::Gemini, "write:one.txt").await else {
        return;
    };
    let mut runner = Runner::spawn(&mut case.command());
    let snap = case.sealed(&mut runner, "run-1").await;
    let sealed_at = std::time::SystemTime::now();
    assert_eq!(sealed(&snap, "run-1").status.as_str(), "succeeded");
    next_minute_after(sealed_at).await;
    assert_eq!(case.sb.coordinator.queue_turn("fail:503", None), "run-2");
    let snap = case.sealed(&mut runner, "run-2").await;
    let body = sealed(&snap, "run-2");
    assert_eq!(body.status.as_str(), "failed", "{body:?}");
    assert_eq!(
        error_code(&body),
        "provider_overloaded",
        "{:?}\n{}",
        body.error,
        runner.output()
    );
    case.sb.coordinator.end_session();
    runner.finish().await;
    assert_nothing_left(&case.sb.root()).await;
}

/// SIGTERM mid-turn: the run sealed `interrupted`, the runner exits 143,
/// nothing left running (Gemini CLI relaunches itself as a child node
/// process: both go with the turn's tree).
#[tokio::test]
async fn real_gemini_acp_sigterm_mid_turn() {
    sigterm_mid_turn(Agent::Gemini).await;
}
