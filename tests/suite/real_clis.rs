//! The agent adapters against the real CLIs: the real binary with `--agent
//! claude | codex | codex-exec | opencode | opencode-run` against the
//! reference coordinator, driving Claude Code, Codex and opencode as
//! installed by `scripts/install-agent-clis` (pinned in
//! `tools/agent-clis/package.json`) into `target/agent-clis/`, or found in
//! `$HOSTED_BOOT_AGENT_CLIS`. The CLIs talk to a fake model provider on
//! loopback (`tests/fakes/model-provider`) that scripts each turn (its
//! prompt names the scenario: `write:NAME`, `sleep:NAME`, `fail:KIND`) and
//! logs what each CLI sent. Where a CLI is not installed, its tests fail
//! naming it (or skip, recorded, where the run allows skipping:
//! `hosted_boot_test_support::skip`). The cases that wait out a CLI's own
//! backoff cost minutes and are `#[ignore]`d: `--run-ignored all` runs them. The CLIs' state (HOME, CODEX_HOME, opencode's
//! XDG directories) stays in the test's temporary directories.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hosted_boot::wire::FinishBody;
use hosted_boot_coordinator::{CoordinatorOptions, Snapshot};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

use super::support::Sandbox;

const FAKES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fakes");
/// Bound on a real CLI's turn: a cold opencode start takes seconds, more
/// on a loaded machine.
pub(super) const TURN_WAIT: Duration = Duration::from_secs(120);
/// Bound on a turn's seal in a case that waits out a CLI's own backoff
/// (opencode's is minutes per attempt): see [`SLOW`].
const SLOW_TURN_WAIT: Duration = Duration::from_secs(20 * 60);
/// Set by the `#[ignore]`d cases that wait out a CLI's own backoff: their
/// turns are bounded by [`SLOW_TURN_WAIT`] (each test is a process of its
/// own under nextest).
static SLOW: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The directory holding the real CLIs, when `cli` is installed there;
/// otherwise the test skips (it fails unless the run allows skipping).
pub(super) fn installed(cli: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("HOSTED_BOOT_AGENT_CLIS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("target/agent-clis/node_modules/.bin")
        });
    if dir.join(cli).is_file() {
        Some(dir)
    } else {
        hosted_boot_test_support::skip(format!(
            "{cli} is not installed in {} (run scripts/install-agent-clis, which needs npm, or set \
             HOSTED_BOOT_AGENT_CLIS)",
            dir.display()
        ));
        None
    }
}

/// The fake model provider, a child process on a loopback port.
pub(super) struct Provider {
    child: std::process::Child,
    port: u16,
    log: PathBuf,
}

impl Provider {
    pub(super) fn start(dir: &Path) -> Provider {
        let port_file = dir.join("provider.port");
        let log = dir.join("provider.log");
        let child = std::process::Command::new("python3")
            .arg(format!("{FAKES}/model-provider"))
            .arg(&port_file)
            .arg(&log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let port = loop {
            if let Ok(p) = std::fs::read_to_string(&port_file) {
                break p.trim().parse().unwrap();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the fake provider did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        Provider { child, port, log }
    }

    pub(super) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every model request it answered (the tool-less ones included).
    pub(super) fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|r| r["method"] == "POST" && r.get("api").is_some())
            .collect()
    }

    /// The requests of the agent's main loop (with tools), from `from` on.
    pub(super) fn turn_requests(&self, from: usize) -> Vec<Value> {
        self.requests()
            .into_iter()
            .skip(from)
            .filter(|r| r["tools"].as_array().is_some_and(|t| !t.is_empty()))
            .collect()
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An npm cache shared by the tests' opencode homes (opencode installs its
/// provider package at start).
fn npm_cache() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/agent-clis/npm-cache")
}

/// The platform's instructions every case's session carries (PROTOCOL.md
/// 3, "The platform's instructions"): the provider logs the marker where
/// a model request's instructions hold it.
const INSTRUCTIONS: &str = "Platform rule MARK:platform-instructions-7d1e: keep commits small.";

/// Whether `request`'s instructions (system or developer) hold the
/// platform's.
fn has_instructions(request: &Value) -> bool {
    request["markers"]
        .as_array()
        .is_some_and(|m| m.iter().any(|m| m == "MARK:platform-instructions-7d1e"))
}

/// Asserts the platform's instructions reached the model in `requests` and
/// were never committed by the harvest nor left in `repo/`.
fn assert_instructions(case: &Case, requests: &[Value], turn: &str) {
    assert!(
        requests.iter().all(has_instructions),
        "{turn}: the platform's instructions are not in every model request: {:?}",
        requests
            .iter()
            .map(|r| &r["instructions"])
            .collect::<Vec<_>>()
    );
    let log = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(case.sb.coordinator.bare_repo())
        .args(["log", "-p", "--all"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&log.stdout).contains("platform-instructions-7d1e"),
        "{turn}: a harvest commit holds the instructions"
    );
    let grep = std::process::Command::new("grep")
        .args(["-rl", "--exclude-dir=.git", "platform-instructions-7d1e"])
        .arg(case.repo())
        .output()
        .unwrap();
    assert!(
        grep.stdout.is_empty(),
        "{turn}: repo/ holds the instructions: {}",
        String::from_utf8_lossy(&grep.stdout)
    );
}

/// The CLI an adapter mode drives.
fn cli_of(agent: &str) -> &'static str {
    match agent {
        "claude" => "claude",
        "codex" | "codex-exec" => "codex",
        _ => "opencode",
    }
}

/// The model the coordinator names for `agent` (opencode: provider/model).
pub(super) fn model_of(agent: &str) -> &'static str {
    match cli_of(agent) {
        "claude" => "claude-sonnet-4-5",
        "codex" => "gpt-fake",
        _ => "fake/fake-model",
    }
}

/// One real-CLI case: the sandbox, the provider, the CLIs' state.
struct Case {
    sb: Sandbox,
    provider: Provider,
    agent: &'static str,
    bin: PathBuf,
    /// Codex refuses to create its helper links under /tmp: its home lives
    /// in the build's temporary directory.
    codex_home: tempfile::TempDir,
}

impl Case {
    async fn start(agent: &'static str, task: &str) -> Option<Case> {
        Case::start_with(agent, task, None).await
    }

    /// As [`Case::start`], the session naming `agent_session_id` to resume.
    async fn start_with(
        agent: &'static str,
        task: &str,
        agent_session_id: Option<&str>,
    ) -> Option<Case> {
        let opts = CoordinatorOptions {
            agent_session_id: agent_session_id.map(str::to_string),
            ..CoordinatorOptions::default()
        };
        Case::start_from(agent, task, opts).await
    }

    /// As [`Case::start`], the coordinator's other options from `opts`.
    async fn start_from(agent: &'static str, task: &str, opts: CoordinatorOptions) -> Option<Case> {
        let bin = installed(cli_of(agent))?;
        let sb = Sandbox::start(CoordinatorOptions {
            task: task.into(),
            model: Some(model_of(agent).into()),
            reasoning_effort: Some("high".into()),
            instructions: Some(INSTRUCTIONS.into()),
            ..opts
        })
        .await;
        let provider = Provider::start(sb.dir.path());
        let codex_home = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let case = Case {
            sb,
            provider,
            agent,
            bin,
            codex_home,
        };
        case.configure();
        Some(case)
    }

    /// Writes the CLIs' provider configuration into their state dirs.
    fn configure(&self) {
        let url = self.provider.url();
        std::fs::write(
            self.codex_home.path().join("config.toml"),
            format!(
                "model_provider = \"fake\"\n\
                 [model_providers.fake]\nname = \"fake\"\nbase_url = \"{url}/v1\"\n\
                 env_key = \"OPENAI_API_KEY\"\nwire_api = \"responses\"\n\
                 request_max_retries = 0\nstream_max_retries = 0\n"
            ),
        )
        .unwrap();
        let oc = self.sb.dir.path().join(".config/opencode");
        std::fs::create_dir_all(&oc).unwrap();
        std::fs::write(
            oc.join("opencode.json"),
            json!({
                "$schema": "https://opencode.ai/config.json",
                "provider": {"fake": {
                    "npm": "@ai-sdk/openai-compatible", "name": "Fake",
                    "options": {"baseURL": format!("{url}/v1"), "apiKey": "test-key"},
                    // A reasoning model: opencode maps the turn's effort
                    // (its `variant`) onto `reasoning_effort`.
                    "models": {"fake-model": {"name": "Fake model", "reasoning": true}}}},
                "share": "disabled", "autoupdate": false
            })
            .to_string(),
        )
        .unwrap();
    }

    /// The runner for this case's adapter, the real CLIs first on PATH.
    fn command(&self) -> Command {
        let mut cmd = self.sb.command("run", Path::new("/nonexistent"));
        let path = format!(
            "{}:{}",
            self.bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        cmd.env("PATH", path)
            .env("HOSTED_BOOT_AGENT", self.agent)
            .env_remove("HOSTED_BOOT_AGENT_COMMAND")
            .env("CODEX_HOME", self.codex_home.path())
            .env("OPENAI_API_KEY", "test-key")
            .env("ANTHROPIC_API_KEY", "test-key")
            .args([
                "--agent-env",
                &format!("ANTHROPIC_BASE_URL={}", self.provider.url()),
            ])
            .args(["--agent-env", "DISABLE_TELEMETRY=1"])
            .args(["--agent-env", "DISABLE_AUTOUPDATER=1"])
            // Set the way an image sets them: in the runner's environment.
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("CLAUDE_CODE_MAX_RETRIES", "0")
            // opencode fetches models.dev, LSP servers and its default
            // plugins at start: none of that is under test, and it costs
            // tens of seconds on a loaded machine.
            .args(["--agent-env", "OPENCODE_DISABLE_MODELS_FETCH=1"])
            .args(["--agent-env", "OPENCODE_DISABLE_LSP_DOWNLOAD=1"])
            .args(["--agent-env", "OPENCODE_DISABLE_DEFAULT_PLUGINS=1"])
            .args(["--agent-env", "OPENCODE_DISABLE_CLAUDE_CODE=1"])
            .args([
                "--agent-env",
                &format!("npm_config_cache={}", npm_cache().display()),
            ])
            // A cold CLI on a loaded machine can be silent for longer than
            // the scaled idle watchdog; TURN_WAIT bounds the test instead.
            .args(["--agent-idle-timeout", "0"]);
        if cli_of(self.agent) == "opencode" {
            // opencode (a Bun process, served or run) exits about 100 ms
            // after SIGTERM on a quiet machine, but took more than 2.5 s
            // (the stop grace at scale 0.5) once under the whole suite's
            // load (CI, 2026-12-06): the production graces (5 s to stop,
            // 10 s after an interrupt) tell a CLI that ignores its stop
            // signal from a slow one.
            cmd.env("HOSTED_BOOT_TEST_TIME_SCALE", "1");
        }
        cmd
    }

    fn repo(&self) -> PathBuf {
        std::fs::canonicalize(self.sb.root()).unwrap().join("repo")
    }

    /// The file `name` on the session branch of the served repository.
    fn pushed(&self, name: &str) -> Option<String> {
        let out = std::process::Command::new("git")
            .arg("--git-dir")
            .arg(self.sb.coordinator.bare_repo())
            .arg("show")
            .arg(format!("{}:{name}", self.sb.coordinator.branch()))
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Waits until `run` is sealed; on a timeout, fails with the runner's
    /// log and the provider's.
    async fn sealed(&self, runner: &mut Runner, run: &str) -> Snapshot {
        let wait = if SLOW.load(std::sync::atomic::Ordering::Relaxed) {
            SLOW_TURN_WAIT
        } else {
            TURN_WAIT
        };
        let got = self
            .sb
            .coordinator
            .wait_for(wait, |s| s.run(run).is_some_and(|r| r.finish.is_some()))
            .await;
        match got {
            Ok(snap) => snap,
            Err(e) => {
                let _ = runner.child.start_kill();
                kill_leftovers(&self.sb.root());
                panic!(
                    "{run} was not sealed: {e:?}\nrunner:\n{}\nprovider:\n{}",
                    runner.output(),
                    std::fs::read_to_string(&self.provider.log).unwrap_or_default()
                );
            }
        }
    }
}

/// A runner whose output is read as it comes.
pub(super) struct Runner {
    pub(super) child: Child,
    output: Arc<Mutex<Vec<u8>>>,
}

impl Runner {
    pub(super) fn spawn(cmd: &mut Command) -> Runner {
        let mut child = cmd.spawn().unwrap();
        let output = Arc::new(Mutex::new(Vec::new()));
        let pipes: Vec<Box<dyn tokio::io::AsyncRead + Unpin + Send>> = vec![
            Box::new(child.stdout.take().unwrap()),
            Box::new(child.stderr.take().unwrap()),
        ];
        for mut pipe in pipes {
            let output = output.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 8192];
                while let Ok(n) = pipe.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    output.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            });
        }
        Runner { child, output }
    }

    pub(super) fn output(&self) -> String {
        String::from_utf8_lossy(&self.output.lock().unwrap()).into_owned()
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id().unwrap()
    }

    pub(super) async fn finish(mut self) -> (ExitStatus, String) {
        let status = tokio::time::timeout(TURN_WAIT, self.child.wait())
            .await
            .expect("the runner did not exit in time")
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        (status, self.output())
    }
}

/// Waits until `started` exists (the scenario's tool wrote it), failing
/// with the runner's output after [`TURN_WAIT`].
pub(super) async fn tool_started(started: &Path, runner: &Runner) {
    let deadline = std::time::Instant::now() + TURN_WAIT;
    while !started.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the tool did not start:\n{}",
            runner.output()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Processes whose working directory is under `root` (what the agent and
/// its tools left running), as (pid, command line).
pub(super) fn leftovers(root: &Path) -> Vec<(i32, String)> {
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cwd) = std::fs::read_link(entry.path().join("cwd")) else {
            continue;
        };
        if cwd.starts_with(&root) {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // A zombie has no cwd link, but be safe.
            if stat.contains(") Z ") {
                continue;
            }
            out.push((pid, String::from_utf8_lossy(&cmdline).replace('\0', " ")));
        }
    }
    out
}

pub(super) fn kill_leftovers(root: &Path) {
    for (pid, _) in leftovers(root) {
        if let Some(pid) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}

/// Nothing the agent started is left running (bounded: a process killed
/// by the runner's last signal may take a moment to be reaped).
pub(super) async fn assert_nothing_left(root: &Path) {
    for _ in 0..100 {
        if leftovers(root).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left = leftovers(root);
    kill_leftovers(root);
    panic!("left running: {left:?}");
}

pub(super) fn sealed(snap: &Snapshot, run: &str) -> FinishBody {
    snap.run(run).unwrap().finish.clone().unwrap()
}

pub(super) fn usage(body: &FinishBody) -> Value {
    serde_json::to_value(&body.usage).unwrap()
}

pub(super) fn error_code(body: &FinishBody) -> String {
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

pub(super) fn events<'a>(snap: &'a Snapshot, run: &str, kind: &str) -> Vec<&'a Value> {
    snap.run(run)
        .unwrap()
        .events
        .iter()
        .filter(|e| e.kind == kind)
        .map(|e| &e.data)
        .collect()
}

/// The user texts of a request, joined.
pub(super) fn users(request: &Value) -> String {
    request["users"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// Turn 2 (`write:two.txt`) queued and sealed `succeeded` in turn 1's
/// agent session `sid`: its seal, and the provider's requests from `seen`
/// on.
async fn second_turn(
    case: &Case,
    runner: &mut Runner,
    sid: &str,
    seen: usize,
) -> (FinishBody, Vec<Value>) {
    assert_eq!(
        case.sb.coordinator.queue_turn("write:two.txt", None),
        "run-2"
    );
    let snap = case.sealed(runner, "run-2").await;
    let second = sealed(&snap, "run-2");
    assert_eq!(second.status.as_str(), "succeeded", "{second:?}");
    assert_eq!(second.agent_session_id.as_deref(), Some(sid));
    (second, case.provider.turn_requests(seen))
}

/// Four turns: write a file; a second that resumes the first's agent
/// session; a third interrupted mid-tool; a fourth after the interrupt.
async fn four_turns(agent: &'static str) {
    let Some(case) = Case::start(agent, "write:one.txt").await else {
        return;
    };
    let mut runner = Runner::spawn(&mut case.command());

    // Turn 1: a tool call writes one.txt, then a final message.
    let snap = case.sealed(&mut runner, "run-1").await;
    let first = sealed(&snap, "run-1");
    assert_eq!(first.status.as_str(), "succeeded", "{first:?}");
    let sid = first.agent_session_id.clone().expect("an agent session id");
    let turn1 = case.provider.turn_requests(0);
    assert_eq!(turn1.len(), 2, "a tool call, then the final message");
    let u = usage(&first);
    assert_eq!(u["model"], model_of(agent), "{u}");
    assert_eq!(u["inputTokens"], 200, "{u}");
    assert_eq!(u["outputTokens"], 20, "{u}");
    assert_eq!(
        turn1[0]["model"],
        model_of(agent).rsplit('/').next().unwrap()
    );
    assert_eq!(case.pushed("one.txt").as_deref(), Some("done"));
    assert_instructions(&case, &turn1, "turn 1");
    if cli_of(agent) == "opencode" {
        // The session's effort reached the provider: `--variant` (run) or
        // the prompt's `variant` (serve), as opencode's reasoning setting.
        assert!(
            turn1.iter().all(|r| r["effort"] == "high"),
            "the effort did not reach the provider: {:?}",
            turn1.iter().map(|r| &r["effort"]).collect::<Vec<_>>()
        );
    }

    // Turn 2 resumes the session: the provider sees turn 1's prompt.
    let seen = case.provider.requests().len();
    let (second, turn2) = second_turn(&case, &mut runner, &sid, seen).await;
    assert_eq!(turn2.len(), 2);
    assert!(
        users(&turn2[0]).contains("write:one.txt"),
        "turn 2 did not resume turn 1's conversation: {}",
        users(&turn2[0])
    );
    assert_eq!(
        usage(&second)["inputTokens"],
        200,
        "turn 2's usage counts only turn 2: {:?}",
        usage(&second)
    );
    assert_eq!(case.pushed("two.txt").as_deref(), Some("done"));
    assert_instructions(&case, &turn2, "turn 2 (resumed)");

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
    if agent == "codex-exec" {
        // An interrupted `codex exec` prints no usage: none is reported.
        let u3 = usage(&third);
        assert!(
            u3["inputTokens"].is_null() && u3["outputTokens"].is_null(),
            "turn 3 (interrupted, no usage printed) reports tokens: {u3}"
        );
    }
    assert_nothing_left(&case.repo()).await;

    // Turn 4 after the interrupt.
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
    // The interrupted turn's tokens are not counted in turn 4. codex exec
    // prints only the thread's running total, and none for the interrupted
    // turn: turn 4's own share is unknown, so its token counts are left
    // out (a difference from turn 2's total would add turn 3's tokens).
    let u4 = usage(&fourth);
    if agent == "codex-exec" {
        assert!(
            u4["inputTokens"].is_null() && u4["outputTokens"].is_null(),
            "turn 4's usage holds the interrupted turn's tokens: {u4}"
        );
        assert_eq!(u4["model"], model_of(agent), "{u4}");
    } else {
        assert_eq!(
            u4["inputTokens"], 200,
            "turn 4's usage counts only turn 4: {u4}"
        );
    }
    assert_eq!(case.pushed("four.txt").as_deref(), Some("done"));

    case.sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_nothing_left(&case.sb.root()).await;
    // The CLI stopped the way it stops: no turn waited out its grace. (Claude
    // Code 2.1.197 does not exit after an interrupt while its Bash tool
    // runs, until its tool is killed: the interrupted turn is exempt for it.)
    // opencode exits 30–90 ms after SIGTERM here, but under the whole
    // suite's load in CI its server sometimes outlives the 5 s stop grace
    // idle in its event loop (2026-12-06: the first turn twice, then turns
    // 1–3 of one run), never on this machine in 10 runs of four turns,
    // alone, beside the other opencode tests or beside two busy loops. The
    // runner's SIGKILL after the grace is the designed answer, so for
    // opencode slow stops are printed and tolerated short of all four: a
    // wrong stop signal makes every turn wait.
    let grace = "agent still running after the grace period";
    let waited: Vec<&str> = output
        .lines()
        .filter(|l| l.contains(grace))
        .filter(|l| cli_of(agent) != "claude" || !l.contains("\"run-3\""))
        .collect();
    let tolerated = if cli_of(agent) == "opencode" { 3 } else { 0 };
    if !waited.is_empty() {
        eprintln!(
            "{agent}: turns that waited out their grace:\n{}",
            waited.join("\n")
        );
    }
    assert!(
        waited.len() <= tolerated,
        "an agent waited out its grace:\n{}",
        waited.join("\n")
    );
}

#[tokio::test]
async fn real_claude_four_turns() {
    four_turns("claude").await;
}

#[tokio::test]
async fn real_codex_four_turns() {
    four_turns("codex").await;
}

#[tokio::test]
async fn real_codex_exec_four_turns() {
    four_turns("codex-exec").await;
}

#[tokio::test]
async fn real_opencode_four_turns() {
    four_turns("opencode").await;
}

#[tokio::test]
async fn real_opencode_run_four_turns() {
    four_turns("opencode-run").await;
}

/// One failing first turn: its seal and the runner's output.
async fn failed_turn(case: &Case) -> (FinishBody, Snapshot, String) {
    let mut runner = Runner::spawn(&mut case.command());
    let snap = case.sealed(&mut runner, "run-1").await;
    // A turn failed with a retryable class leaves the boot waiting for the
    // next turn.
    case.sb.coordinator.end_session();
    let (_, output) = runner.finish().await;
    assert_nothing_left(&case.sb.root()).await;
    (sealed(&snap, "run-1"), snap, output)
}

/// Issue 39, the interim fix, with the real CLI: the session names an agent
/// session this sandbox's CLI state does not hold (a new sandbox). The CLI
/// refuses the resume; the turn runs in a fresh agent session, its work
/// pushed, `finish.agentSessionReset` naming the refused id.
async fn refused_resume_runs_fresh(agent: &'static str) {
    // Claude Code takes a UUID; the others take any id.
    let unknown = "3f0c5b2e-8d4a-4c1e-9b7a-2a6f1e0d9c4b";
    let Some(case) = Case::start_with(agent, "write:fresh.txt", Some(unknown)).await else {
        return;
    };
    let mut runner = Runner::spawn(&mut case.command());
    let snap = case.sealed(&mut runner, "run-1").await;
    case.sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    let body = sealed(&snap, "run-1");
    assert_eq!(body.status.as_str(), "succeeded", "{body:?}\n{output}");
    assert_eq!(status.code(), Some(0), "{output}");
    let reset = body
        .agent_session_reset
        .as_ref()
        .unwrap_or_else(|| panic!("no agentSessionReset: {body:?}\n{output}"));
    assert_eq!(reset.requested, unknown);
    let fresh = body.agent_session_id.clone().unwrap_or_default();
    assert!(!fresh.is_empty() && fresh != unknown, "{fresh:?}");
    // The refused session is never reported as resumed.
    let sessions: Vec<&Value> = snap
        .run("run-1")
        .unwrap()
        .events
        .iter()
        .filter(|e| e.kind == "hosted_boot.agent_session")
        .map(|e| &e.data)
        .collect();
    assert!(
        sessions.iter().all(|d| d["agentSessionId"] != unknown),
        "{sessions:?}"
    );
    assert_eq!(case.pushed("fresh.txt").as_deref(), Some("done"));
    assert_nothing_left(&case.sb.root()).await;
}

#[tokio::test]
async fn real_claude_refused_resume_runs_fresh() {
    refused_resume_runs_fresh("claude").await;
}

#[tokio::test]
async fn real_codex_refused_resume_runs_fresh() {
    refused_resume_runs_fresh("codex").await;
}

#[tokio::test]
async fn real_codex_exec_refused_resume_runs_fresh() {
    refused_resume_runs_fresh("codex-exec").await;
}

#[tokio::test]
async fn real_opencode_refused_resume_runs_fresh() {
    refused_resume_runs_fresh("opencode").await;
}

#[tokio::test]
async fn real_opencode_run_refused_resume_runs_fresh() {
    refused_resume_runs_fresh("opencode-run").await;
}

/// Issue 38 with the real CLIs: with `--prestart-agent on` the CLI for
/// turn 2 is started while the runner waits for that turn. It sends the
/// provider nothing before its prompt (nothing, for two seconds after it
/// was started); turn 2 then resumes turn 1's conversation in that process
/// and pushes its work; the one started for turn 3 goes when the session
/// ends.
async fn prestarted_sends_nothing_before_its_turn(agent: &'static str) {
    let Some(case) = Case::start(agent, "write:one.txt").await else {
        return;
    };
    let (mut runner, sid) = first_turn_prestarted(&case).await;
    let seen = case.provider.requests().len();
    // Claude Code and Codex start in well under a second, opencode serve
    // listens after about 1.6 s on a quiet machine: whatever they would
    // send at start they have sent by now.
    let settle = if cli_of(agent) == "opencode" { 8 } else { 2 };
    tokio::time::sleep(Duration::from_secs(settle)).await;
    assert_eq!(
        case.provider.requests().len(),
        seen,
        "the pre-started CLI called the provider before its turn"
    );
    let (_, turn2) = second_turn(&case, &mut runner, &sid, seen).await;
    assert!(
        users(&turn2[0]).contains("write:one.txt"),
        "turn 2 did not resume turn 1's conversation: {}",
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
async fn real_claude_prestarted_sends_nothing_before_its_turn() {
    prestarted_sends_nothing_before_its_turn("claude").await;
}

#[tokio::test]
async fn real_codex_prestarted_sends_nothing_before_its_turn() {
    prestarted_sends_nothing_before_its_turn("codex").await;
}

#[tokio::test]
async fn real_opencode_prestarted_sends_nothing_before_its_turn() {
    prestarted_sends_nothing_before_its_turn("opencode").await;
}

/// Turn 1 with `--prestart-agent on`, once the CLI for turn 2 is started:
/// the runner and turn 1's agent session.
async fn first_turn_prestarted(case: &Case) -> (Runner, String) {
    let mut runner = Runner::spawn(case.command().args(["--prestart-agent", "on"]));
    let snap = case.sealed(&mut runner, "run-1").await;
    let sid = sealed(&snap, "run-1")
        .agent_session_id
        .expect("an agent session id");
    prestarted_pgid(&runner, 1).await;
    (runner, sid)
}

/// The process group of the `n`th agent pre-started so far, once the
/// runner has logged it.
async fn prestarted_pgid(runner: &Runner, n: usize) -> u32 {
    const LINE: &str = "agent pre-started for the next turn";
    let deadline = std::time::Instant::now() + TURN_WAIT;
    loop {
        let output = runner.output();
        if let Some(line) = output.lines().filter(|l| l.contains(LINE)).nth(n - 1) {
            let at = line.find("\"pgid\":").expect("a pgid") + "\"pgid\":".len();
            let digits: String = line[at..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            return digits.parse().unwrap();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no agent was pre-started ({n}):\n{output}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A pre-started CLI that died before its turn, and one whose work tree
/// the turn's sync changed (the CLI read `AGENTS.md` and `CLAUDE.md` at its
/// start), are not used: each turn starts its CLI cold, resumes the
/// conversation and pushes its work; the one waiting when the session ends
/// goes with nothing left.
async fn prestarted_is_discarded(agent: &'static str) {
    let Some(case) = Case::start(agent, "write:one.txt").await else {
        return;
    };
    let (mut runner, sid) = first_turn_prestarted(&case).await;
    let waiting = prestarted_pgid(&runner, 1).await;
    super::support::signal(waiting, rustix::process::Signal::KILL);
    let (_, turn2) = second_turn(&case, &mut runner, &sid, case.provider.requests().len()).await;
    assert!(!turn2.is_empty(), "turn 2 called no provider");
    prestarted_pgid(&runner, 2).await;
    super::harvest::advance_remote(&case.sb, "AGENTS.md");
    assert_eq!(
        case.sb.coordinator.queue_turn("write:three.txt", None),
        "run-3"
    );
    let snap = case.sealed(&mut runner, "run-3").await;
    let third = sealed(&snap, "run-3");
    assert_eq!(third.status.as_str(), "succeeded", "{third:?}");
    assert_eq!(third.agent_session_id.as_deref(), Some(sid.as_str()));
    assert_eq!(case.pushed("three.txt").as_deref(), Some("done"));
    prestarted_pgid(&runner, 3).await;
    case.sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    for why in [
        "it exited before its turn",
        "the workspace sync changed the work tree it was started in",
        "the session ended or the runner stops",
    ] {
        assert!(output.contains(why), "not discarded: {why}\n{output}");
    }
    assert!(
        !output.contains("the turn uses the pre-started agent"),
        "{output}"
    );
    assert_nothing_left(&case.sb.root()).await;
}

#[tokio::test]
async fn real_claude_prestarted_is_discarded_when_it_died_or_the_tree_changed() {
    prestarted_is_discarded("claude").await;
}

#[tokio::test]
async fn real_codex_prestarted_is_discarded_when_it_died_or_the_tree_changed() {
    prestarted_is_discarded("codex").await;
}

#[tokio::test]
async fn real_opencode_prestarted_is_discarded_when_it_died_or_the_tree_changed() {
    prestarted_is_discarded("opencode").await;
}

/// The wrap-up (issue 38 item 3): with a 30 s time cap and the wrap-up 24 s
/// before it, Claude Code gets the message 6 s into a turn whose tool runs
/// 10 s (started within about 2 s of the turn's start, 4 s under load).
/// It is folded into the tool's result, so it reaches the model within the
/// turn, and the turn ends at its result, well before the cap.
#[tokio::test]
async fn real_claude_wrap_up_reaches_the_model_before_the_cap() {
    const MARK: &str = "MARK:wrap-up-5c2e";
    let opts = CoordinatorOptions {
        duration_minutes: Some(0.5),
        ..CoordinatorOptions::default()
    };
    let Some(case) = Case::start_from("claude", "nap:one.txt", opts).await else {
        return;
    };
    let mut runner = Runner::spawn(case.command().args([
        "--wrap-up-before",
        "24s",
        "--wrap-up-message",
        &format!("{MARK} Time is nearly up: commit and summarise."),
    ]));
    let snap = case.sealed(&mut runner, "run-1").await;
    let body = sealed(&snap, "run-1");
    assert_eq!(body.status.as_str(), "succeeded", "{body:?}");
    let wrap_ups = events(&snap, "run-1", "hosted_boot.wrap_up");
    assert_eq!(wrap_ups.len(), 1, "{wrap_ups:?}");
    assert_eq!(wrap_ups[0]["beforeMs"], 24_000, "{wrap_ups:?}");
    let requests = case.provider.turn_requests(0);
    let reached = requests.iter().position(|r| {
        r["bodyMarkers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m == MARK)
    });
    assert!(
        reached.is_some(),
        "the wrap-up never reached the model: {requests:?}"
    );
    assert_eq!(case.pushed("one.txt").as_deref(), Some("started\n"));
    case.sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert!(!output.contains("time cap is reached"), "{output}");
    assert_nothing_left(&case.sb.root()).await;
}

/// A wrap-up asked for while the model answers (no tool runs) is held for
/// a tool call that never comes, so it never reaches the CLI: Claude Code
/// 2.1.197 would run such a message as another turn after the result (it
/// did after an interrupt, and pushed that turn's work), or, stopped, keep
/// it in the session as an unanswered message the next turn resumes (found
/// by two reviews of issue 38). The next turn's conversation has no trace
/// of it.
#[tokio::test]
async fn real_claude_wrap_up_asked_while_the_model_answers_never_enters_the_session() {
    const MARK: &str = "MARK:wrap-up-9d41";
    let opts = CoordinatorOptions {
        duration_minutes: Some(0.5),
        ..CoordinatorOptions::default()
    };
    let Some(case) = Case::start_from("claude", "think:8 say hi", opts).await else {
        return;
    };
    let mut runner = Runner::spawn(case.command().args([
        "--wrap-up-before",
        "26s",
        "--wrap-up-message",
        &format!("{MARK} write:after.txt"),
    ]));
    let snap = case.sealed(&mut runner, "run-1").await;
    let first = sealed(&snap, "run-1");
    assert_eq!(first.status.as_str(), "succeeded", "{first:?}");
    assert!(events(&snap, "run-1", "hosted_boot.wrap_up").is_empty());
    let sid = first.agent_session_id.clone().expect("an agent session id");
    let seen = case.provider.requests().len();
    let (_, turn2) = second_turn(&case, &mut runner, &sid, seen).await;
    case.sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    let all = case.provider.turn_requests(0);
    assert!(
        all.iter().all(|r| {
            r["bodyMarkers"]
                .as_array()
                .is_none_or(|m| m.iter().all(|m| m != MARK))
        }),
        "the wrap-up reached the model: {all:?}"
    );
    assert!(!turn2.is_empty());
    assert!(!case.repo().join("after.txt").exists(), "{output}");
    assert_eq!(case.pushed("two.txt").as_deref(), Some("done"));
    assert_nothing_left(&case.sb.root()).await;
}

/// A provider error of `kind` on every request: the turn fails with `code`.
async fn provider_error(agent: &'static str, kind: &str, code: &str) {
    let Some(case) = Case::start(agent, &format!("fail:{kind}")).await else {
        return;
    };
    let (body, _, output) = failed_turn(&case).await;
    assert_eq!(body.status.as_str(), "failed", "{body:?}\n{output}");
    assert_eq!(error_code(&body), code, "{body:?}");
}

/// A persistent 529 (overloaded): the turn fails provider_overloaded after
/// the runner's two overload continuations of the agent session. (A single
/// 529 is retried by the CLIs themselves and never reaches the adapter.)
/// opencode's own backoff on a persistent 529 takes about four minutes:
/// its cases are `#[ignore]`d (the newest-versions command runs them).
async fn overload_continuation(agent: &'static str) {
    if cli_of(agent) == "opencode" {
        SLOW.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let Some(case) = Case::start(agent, "fail:529 write:one.txt").await else {
        return;
    };
    let (body, snap, output) = failed_turn(&case).await;
    assert_eq!(
        error_code(&body),
        "provider_overloaded",
        "{body:?}\n{output}"
    );
    assert_eq!(
        events(&snap, "run-1", "hosted_boot.overload_continuation").len(),
        2,
        "{body:?}"
    );
}

#[tokio::test]
async fn real_claude_overload_is_continued() {
    overload_continuation("claude").await;
}

#[tokio::test]
async fn real_codex_overload_is_continued() {
    overload_continuation("codex").await;
}

#[tokio::test]
async fn real_codex_exec_overload_is_continued() {
    overload_continuation("codex-exec").await;
}

#[tokio::test]
#[ignore = "opencode's own backoff costs minutes: run with --run-ignored all (README, the newest versions)"]
async fn real_opencode_overload_is_continued() {
    overload_continuation("opencode").await;
}

#[tokio::test]
#[ignore = "opencode's own backoff costs minutes: run with --run-ignored all (README, the newest versions)"]
async fn real_opencode_run_overload_is_continued() {
    overload_continuation("opencode-run").await;
}

#[tokio::test]
async fn real_claude_auth_error() {
    provider_error("claude", "401", "provider_auth").await;
}

#[tokio::test]
async fn real_codex_auth_error() {
    provider_error("codex", "401", "provider_auth").await;
}

#[tokio::test]
async fn real_codex_exec_auth_error() {
    provider_error("codex-exec", "401", "provider_auth").await;
}

/// An exhausted quota (Anthropic's credit-balance 400; OpenAI's 429
/// `insufficient_quota`, for Codex and opencode alike): not retryable,
/// `provider_quota_exhausted` in every adapter mode. opencode 1.18.33
/// retries that 429 with its own backoff, and `opencode run --format json`
/// prints nothing while it does (the serve adapter sees the retry notices
/// and gives up): the `opencode-run` case costs minutes and is `#[ignore]`d.
async fn quota_exhausted(agent: &'static str) {
    if agent == "opencode-run" {
        SLOW.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let Some(case) = Case::start(agent, "fail:quota").await else {
        return;
    };
    let (body, _, output) = failed_turn(&case).await;
    assert_eq!(body.status.as_str(), "failed", "{body:?}\n{output}");
    let error = body.error.as_ref().expect("an error");
    assert_eq!(
        error_code(&body),
        "provider_quota_exhausted",
        "{body:?}\n{output}"
    );
    assert!(!error.retryable, "{body:?}");
}

#[tokio::test]
async fn real_claude_quota_exhausted() {
    quota_exhausted("claude").await;
}

#[tokio::test]
async fn real_codex_quota_exhausted() {
    quota_exhausted("codex").await;
}

#[tokio::test]
async fn real_codex_exec_quota_exhausted() {
    quota_exhausted("codex-exec").await;
}

#[tokio::test]
async fn real_opencode_quota_exhausted() {
    quota_exhausted("opencode").await;
}

#[tokio::test]
#[ignore = "opencode's own backoff costs minutes: run with --run-ignored all (README, the newest versions)"]
async fn real_opencode_run_quota_exhausted() {
    quota_exhausted("opencode-run").await;
}

#[tokio::test]
async fn real_codex_rate_limit_is_one_rule() {
    provider_error("codex", "429", "provider_limit_unknown").await;
}

#[tokio::test]
async fn real_codex_exec_rate_limit_is_one_rule() {
    provider_error("codex-exec", "429", "provider_limit_unknown").await;
}

/// SIGTERM while a tool runs: the runner seals the turn, stops the agent
/// and its tools, and exits.
async fn sigterm_mid_turn(agent: &'static str) {
    let Some(case) = Case::start(agent, "sleep:started.txt").await else {
        return;
    };
    let mut runner = Runner::spawn(&mut case.command());
    tool_started(&case.repo().join("started.txt"), &runner).await;
    super::support::signal(runner.pid(), rustix::process::Signal::TERM);
    let snap = case.sealed(&mut runner, "run-1").await;
    let (status, output) = runner.finish().await;
    // PROTOCOL.md 4.4: sealed `interrupted`, `turn_completed` posted, no
    // `failed` or `turn_failed`, exit 128+15.
    let body = sealed(&snap, "run-1");
    assert_eq!(body.status.as_str(), "interrupted", "{body:?}\n{output}");
    assert_eq!(status.code(), Some(143), "{output}");
    let posted = case.sb.coordinator.snapshot().status_names();
    assert_eq!(posted, vec!["turn_started", "turn_completed"], "{output}");
    assert_nothing_left(&case.sb.root()).await;
}

#[tokio::test]
async fn real_claude_sigterm_mid_turn() {
    sigterm_mid_turn("claude").await;
}

#[tokio::test]
async fn real_codex_sigterm_mid_turn() {
    sigterm_mid_turn("codex").await;
}

#[tokio::test]
async fn real_opencode_sigterm_mid_turn() {
    sigterm_mid_turn("opencode").await;
}

#[tokio::test]
async fn real_codex_exec_sigterm_mid_turn() {
    sigterm_mid_turn("codex-exec").await;
}

#[tokio::test]
async fn real_opencode_run_sigterm_mid_turn() {
    sigterm_mid_turn("opencode-run").await;
}

/// `<cli> --version` is off the critical path: the real Codex behind a
/// wrapper whose `--version` alone waits for the test's go-ahead, given
/// only once the agent is at work. The agent starts regardless, and the
/// run's `hosted_boot.runner` event still records the version.
#[tokio::test]
async fn real_codex_starts_without_waiting_for_its_version() {
    let Some(case) = Case::start("codex", "sleep:started.txt").await else {
        return;
    };
    let wrapper = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let gate = wrapper.path().join("go-ahead");
    let asked = wrapper.path().join("version-asked");
    let script = wrapper.path().join("codex");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do\n  if [ \"$a\" = --version ]; then\n    : > '{asked}'\n    \
             while [ ! -e '{gate}' ]; do sleep 0.05; done\n  fi\ndone\nexec '{real}' \"$@\"\n",
            asked = asked.display(),
            gate = gate.display(),
            real = case.bin.join("codex").display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut cmd = case.command();
    cmd.env(
        "PATH",
        format!(
            "{}:{}:{}",
            wrapper.path().display(),
            case.bin.display(),
            std::env::var("PATH").unwrap_or_default()
        ),
    );
    let mut runner = Runner::spawn(&mut cmd);
    let started = case.repo().join("started.txt");
    let deadline = std::time::Instant::now() + TURN_WAIT;
    while !started.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent did not start:\n{}",
            runner.output()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(asked.exists(), "the runner never asked for the version");
    std::fs::write(&gate, "").unwrap();
    let version = std::process::Command::new(case.bin.join("codex"))
        .arg("--version")
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    let snap = case
        .sb
        .coordinator
        .wait_for(TURN_WAIT, |s| {
            s.run("run-1")
                .is_some_and(|r| r.events.iter().any(|e| e.kind == "hosted_boot.runner"))
        })
        .await
        .unwrap_or_else(|e| panic!("no hosted_boot.runner event: {e:?}\n{}", runner.output()));
    let event = &events(&snap, "run-1", "hosted_boot.runner")[0];
    assert_eq!(event["cliVersion"], version.as_str(), "{event}");
    case.sb.coordinator.interrupt(Some("run-1")).unwrap();
    let snap = case.sealed(&mut runner, "run-1").await;
    assert_eq!(sealed(&snap, "run-1").status.as_str(), "interrupted");
    assert_eq!(events(&snap, "run-1", "hosted_boot.runner").len(), 1);
    case.sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_nothing_left(&case.sb.root()).await;
}

/// An image's `CLAUDE_CODE_*` setting reaches Claude Code (here
/// `CLAUDE_CODE_MAX_RETRIES=0` in the runner's environment), and a
/// persistent 529 is an overload: the turn fails `provider_overloaded`
/// after its continuations, each a single request.
#[tokio::test]
async fn real_claude_keeps_the_images_settings_and_a_529_is_an_overload() {
    let Some(case) = Case::start("claude", "fail:529 write:one.txt").await else {
        return;
    };
    let (body, snap, output) = failed_turn(&case).await;
    assert_eq!(
        error_code(&body),
        "provider_overloaded",
        "{body:?}\n{output}"
    );
    let continuations = events(&snap, "run-1", "hosted_boot.overload_continuation").len();
    assert_eq!(continuations, 2, "{body:?}");
    assert_eq!(
        case.provider.turn_requests(0).len(),
        1 + continuations,
        "Claude retried on its own: CLAUDE_CODE_MAX_RETRIES did not reach it"
    );
}

/// The files under `dir` whose content holds `text` (none when `dir` is
/// missing).
fn files_holding(dir: &Path, text: &str) -> Vec<PathBuf> {
    let out = std::process::Command::new("grep")
        .args(["-rlF", "--", text])
        .arg(dir)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .collect()
}

/// The stored agent state's files, decoded: `(path, content)`.
fn stored_files(state: &Value) -> Vec<(String, String)> {
    use base64::Engine as _;
    state["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(f["content"].as_str().unwrap())
                .unwrap();
            (
                f["path"].as_str().unwrap().to_string(),
                String::from_utf8_lossy(&bytes).into_owned(),
            )
        })
        .collect()
}

/// A second sandbox on the same session: another root path, and fresh,
/// empty state directories (`HOME`, `CODEX_HOME`) holding only the CLIs'
/// configuration, as a new container from the same image has.
struct SandboxB {
    dir: tempfile::TempDir,
}

impl SandboxB {
    fn new(case: &Case) -> SandboxB {
        // Codex refuses its helper links under /tmp (as for `Case`).
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir_all(home.join(".config/opencode")).unwrap();
        std::fs::copy(
            case.sb.dir.path().join(".config/opencode/opencode.json"),
            home.join(".config/opencode/opencode.json"),
        )
        .unwrap();
        std::fs::create_dir_all(dir.path().join("codex")).unwrap();
        std::fs::copy(
            case.codex_home.path().join("config.toml"),
            dir.path().join("codex/config.toml"),
        )
        .unwrap();
        std::fs::create_dir_all(dir.path().join("sandbox/root-b")).unwrap();
        SandboxB { dir }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("sandbox/root-b")
    }

    fn command(&self, case: &Case) -> Command {
        let mut cmd = case.command();
        cmd.env("HOME", self.dir.path().join("home"))
            .env("CODEX_HOME", self.dir.path().join("codex"))
            .env("HOSTED_BOOT_ROOT", self.root());
        cmd
    }
}

/// Sandbox A is gone: its runner stopped between turns (SIGTERM), its
/// root and the CLIs' state directories removed.
async fn sandbox_a_gone(case: &Case, runner: Runner) {
    super::support::signal(runner.pid(), rustix::process::Signal::TERM);
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(143), "stopped by SIGTERM: {output}");
    assert_nothing_left(&case.sb.root()).await;
    for dir in [
        case.sb.root(),
        case.sb.dir.path().join(".claude"),
        case.sb.dir.path().join(".local"),
        case.codex_home.path().join("sessions"),
    ] {
        if dir.exists() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}

/// Issue 39 with the real CLI: turn 1 in sandbox A saves the CLI's state
/// (redacted: a connector's value in the prompt is not in what the
/// coordinator stores); A goes; turn 2 runs in sandbox B, at another root
/// path with empty state directories, which restores the state before its
/// agent starts: the CLI resumes the same agent session, and the provider
/// sees turn 1's prompt in turn 2's request.
async fn the_conversation_outlives_its_sandbox(agent: &'static str) {
    let secret = "connector-value-4f1d9e2a";
    let opts = CoordinatorOptions {
        connectors: vec![("PLATFORM_TOKEN".into(), secret.into())],
        ..CoordinatorOptions::default()
    };
    let task = format!("write:one.txt and keep {secret} to yourself");
    let Some(case) = Case::start_from(agent, &task, opts).await else {
        return;
    };
    let runner = Runner::spawn(&mut case.command());
    let mut runner = runner;
    let snap = case.sealed(&mut runner, "run-1").await;
    let first = sealed(&snap, "run-1");
    assert_eq!(first.status.as_str(), "succeeded", "{first:?}");
    let sid = first.agent_session_id.clone().expect("an agent session id");
    let saved = events(&snap, "run-1", "hosted_boot.agent_state");
    assert_eq!(saved.len(), 1, "{saved:?}\n{}", runner.output());
    assert_eq!(saved[0]["outcome"], "saved", "{saved:?}");
    assert_eq!(saved[0]["agentSessionId"], sid.as_str());
    let state = snap
        .agent_state
        .clone()
        .expect("the coordinator holds a state");
    assert_eq!(state["agentSessionId"], sid.as_str());
    assert_eq!(state["runId"], "run-1");
    let files = stored_files(&state);
    assert!(
        files.iter().any(|(_, c)| c.contains("write:one.txt")),
        "the transcript is not in the state: {:?}",
        files.iter().map(|(p, _)| p).collect::<Vec<_>>()
    );
    assert!(
        !state.to_string().contains(secret) && files.iter().all(|(_, c)| !c.contains(secret)),
        "the connector's value left the sandbox"
    );
    // The CLI's own file held it: the redaction is the runner's.
    let holding = files_holding(case.sb.dir.path(), secret).len()
        + files_holding(case.codex_home.path(), secret).len();
    assert!(holding > 0, "the CLI kept no copy of the prompt");

    sandbox_a_gone(&case, runner).await;
    let b = SandboxB::new(&case);
    assert_eq!(
        case.sb.coordinator.queue_turn("write:two.txt", None),
        "run-2"
    );
    let seen = case.provider.requests().len();
    let mut runner = Runner::spawn(&mut b.command(&case));
    let snap = case.sealed(&mut runner, "run-2").await;
    let second = sealed(&snap, "run-2");
    let restored = events(&snap, "run-2", "hosted_boot.agent_state");
    assert!(
        restored.first().is_some_and(|e| e["outcome"] == "restored"),
        "{restored:?}\n{}",
        runner.output()
    );
    assert_eq!(second.status.as_str(), "succeeded", "{second:?}");
    assert!(
        second.agent_session_reset.is_none(),
        "the CLI refused the restored session: {second:?}\n{}",
        runner.output()
    );
    assert_eq!(second.agent_session_id.as_deref(), Some(sid.as_str()));
    let turn2 = case.provider.turn_requests(seen);
    assert!(
        users(&turn2[0]).contains("write:one.txt"),
        "turn 2 did not continue turn 1's conversation: {}",
        users(&turn2[0])
    );
    assert!(!users(&turn2[0]).contains(secret));
    assert_eq!(case.pushed("two.txt").as_deref(), Some("done"));
    case.sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_nothing_left(&b.root()).await;
}

#[tokio::test]
async fn real_claude_conversation_outlives_its_sandbox() {
    the_conversation_outlives_its_sandbox("claude").await;
}

#[tokio::test]
async fn real_codex_conversation_outlives_its_sandbox() {
    the_conversation_outlives_its_sandbox("codex").await;
}

#[tokio::test]
async fn real_codex_exec_conversation_outlives_its_sandbox() {
    the_conversation_outlives_its_sandbox("codex-exec").await;
}

#[tokio::test]
async fn real_opencode_conversation_outlives_its_sandbox() {
    the_conversation_outlives_its_sandbox("opencode").await;
}

#[tokio::test]
async fn real_opencode_run_conversation_outlives_its_sandbox() {
    the_conversation_outlives_its_sandbox("opencode-run").await;
}

/// Turn 1 of a claude case with the coordinator's `opts`: its seal, the
/// snapshot, the runner's output, the runner left waiting.
async fn claude_first_turn(
    opts: CoordinatorOptions,
    task: &str,
) -> Option<(Case, Runner, Snapshot)> {
    let case = Case::start_from("claude", task, opts).await?;
    let mut runner = Runner::spawn(&mut case.command());
    let snap = case.sealed(&mut runner, "run-1").await;
    Some((case, runner, snap))
}

/// Ends the session and the runner, and checks nothing is left.
async fn end_case(case: &Case, runner: Runner, root: &Path) {
    case.sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_nothing_left(root).await;
}

/// Issue 39: a save the coordinator keeps refusing is retried under its
/// row (3 attempts), then said in an event; the turn's seal is not
/// affected and the coordinator holds no state.
#[tokio::test]
async fn real_claude_a_failing_save_is_an_event_and_the_turn_stands() {
    let Some(case) = Case::start("claude", "write:one.txt").await else {
        return;
    };
    case.sb
        .coordinator
        .add_fault(
            hosted_boot_coordinator::Fault::status(
                hosted_boot_coordinator::Route::AgentStateSave,
                503,
            )
            .times(3),
        )
        .unwrap();
    let mut runner = Runner::spawn(&mut case.command());
    let snap = case.sealed(&mut runner, "run-1").await;
    let first = sealed(&snap, "run-1");
    assert_eq!(first.status.as_str(), "succeeded", "{first:?}");
    assert!(first.error.is_none(), "{first:?}");
    let state = events(&snap, "run-1", "hosted_boot.agent_state");
    assert_eq!(state.len(), 1, "{state:?}");
    assert_eq!(state[0]["outcome"], "save_failed", "{state:?}");
    assert!(
        state[0]["reason"].as_str().unwrap().contains("503"),
        "{state:?}"
    );
    assert_eq!(
        snap.requests_to(hosted_boot_coordinator::Route::AgentStateSave)
            .len(),
        3
    );
    assert!(snap.agent_state.is_none());
    assert_eq!(case.pushed("one.txt").as_deref(), Some("done"));
    end_case(&case, runner, &case.sb.root()).await;
}

/// Issue 39: a state over the session's `maxBytes` is not sent; an event
/// says so, with the cap.
#[tokio::test]
async fn real_claude_a_state_over_the_cap_is_not_sent() {
    let opts = CoordinatorOptions {
        agent_state_max_bytes: Some(200),
        ..CoordinatorOptions::default()
    };
    let Some((case, runner, snap)) = claude_first_turn(opts, "write:one.txt").await else {
        return;
    };
    assert_eq!(sealed(&snap, "run-1").status.as_str(), "succeeded");
    let state = events(&snap, "run-1", "hosted_boot.agent_state");
    assert_eq!(state.len(), 1, "{state:?}");
    assert_eq!(state[0]["outcome"], "not_saved", "{state:?}");
    assert_eq!(state[0]["maxBytes"], 200, "{state:?}");
    assert!(
        snap.requests_to(hosted_boot_coordinator::Route::AgentStateSave)
            .is_empty()
    );
    end_case(&case, runner, &case.sb.root()).await;
}

/// Issue 39 against a coordinator that does not offer the agent state: no
/// request to its route, no event; a new sandbox's turn runs in a fresh
/// conversation (`agentSessionReset`), never `resume_failed`.
#[tokio::test]
async fn real_claude_without_the_state_route_a_new_sandbox_starts_afresh() {
    let opts = CoordinatorOptions {
        agent_state_max_bytes: None,
        ..CoordinatorOptions::default()
    };
    let Some((case, runner, snap)) = claude_first_turn(opts, "write:one.txt").await else {
        return;
    };
    let sid = sealed(&snap, "run-1").agent_session_id.unwrap();
    sandbox_a_gone(&case, runner).await;
    let b = SandboxB::new(&case);
    case.sb.coordinator.queue_turn("write:two.txt", None);
    let mut runner = Runner::spawn(&mut b.command(&case));
    let snap = case.sealed(&mut runner, "run-2").await;
    let second = sealed(&snap, "run-2");
    assert_eq!(second.status.as_str(), "succeeded", "{second:?}");
    assert_eq!(
        second
            .agent_session_reset
            .as_ref()
            .map(|r| r.requested.as_str()),
        Some(sid.as_str())
    );
    for run in ["run-1", "run-2"] {
        assert!(events(&snap, run, "hosted_boot.agent_state").is_empty());
    }
    for route in [
        hosted_boot_coordinator::Route::AgentStateLoad,
        hosted_boot_coordinator::Route::AgentStateSave,
    ] {
        assert!(snap.requests_to(route).is_empty(), "{route:?}");
    }
    assert_eq!(case.pushed("two.txt").as_deref(), Some("done"));
    end_case(&case, runner, &b.root()).await;
}

/// A claude transcript line, as the CLI writes one.
const TRANSCRIPT_LINE: &str =
    "{\"type\":\"user\",\"message\":{\"role\":\"user\",\"content\":\"hi\"}}\n";

/// A saved state for agent session `sid` whose files are `files` (path,
/// content).
fn planted_state(sid: &str, files: &[(&str, &str)]) -> Value {
    use base64::Engine as _;
    json!({
        "format": 1, "cli": "claude", "agentSessionId": sid, "runId": "run-0",
        "files": files.iter().map(|(p, c)| json!({
            "path": p,
            "content": base64::engine::general_purpose::STANDARD.encode(c),
        })).collect::<Vec<_>>(),
    })
}

/// Issue 39: a saved state that is not one the runner restores is refused
/// whole with an event naming why; nothing is written outside the CLI's
/// directory; the turn runs in a fresh agent session. `plant` may prepare
/// the new sandbox's state directory (a link where the CLI's project
/// directory goes).
async fn a_bad_state_is_refused(state: impl Fn(&str) -> Value, why: &str, plant: impl Fn(&Path)) {
    let sid = "3f0c5b2e-8d4a-4c1e-9b7a-2a6f1e0d9c4b";
    let opts = CoordinatorOptions {
        agent_session_id: Some(sid.into()),
        ..CoordinatorOptions::default()
    };
    let Some(case) = Case::start_from("claude", "write:fresh.txt", opts).await else {
        return;
    };
    case.sb.coordinator.set_agent_state(Some(state(sid)));
    plant(case.sb.dir.path());
    let mut runner = Runner::spawn(&mut case.command());
    let snap = case.sealed(&mut runner, "run-1").await;
    let body = sealed(&snap, "run-1");
    let state = events(&snap, "run-1", "hosted_boot.agent_state");
    assert_eq!(
        state[0]["outcome"],
        "refused",
        "{state:?}\n{}",
        runner.output()
    );
    let reason = state[0]["reason"].as_str().unwrap();
    assert!(reason.contains(why), "{reason}");
    assert_eq!(body.status.as_str(), "succeeded", "{body:?}");
    assert_eq!(
        body.agent_session_reset
            .as_ref()
            .map(|r| r.requested.as_str()),
        Some(sid)
    );
    let escaped: Vec<PathBuf> = files_holding(case.sb.dir.path(), "ESCAPED")
        .into_iter()
        .chain(files_holding(
            Path::new("/tmp/hosted-boot-escape"),
            "ESCAPED",
        ))
        .collect();
    assert!(escaped.is_empty(), "written: {escaped:?}");
    end_case(&case, runner, &case.sb.root()).await;
}

/// A path with `..`, and an absolute one.
#[tokio::test]
async fn real_claude_a_state_with_a_path_outside_the_layout_is_refused() {
    for bad in ["../../../escape.jsonl", "/tmp/hosted-boot-escape/x"] {
        a_bad_state_is_refused(
            |sid| {
                let transcript = format!("{sid}.jsonl");
                planted_state(sid, &[(&transcript, TRANSCRIPT_LINE), (bad, "ESCAPED")])
            },
            "is refused",
            |_| {},
        )
        .await;
    }
}

#[tokio::test]
async fn real_claude_a_corrupt_state_is_refused() {
    a_bad_state_is_refused(
        |sid| {
            let mut s = planted_state(sid, &[(&format!("{sid}.jsonl"), "ESCAPED")]);
            s["files"][0]["content"] = "not base64!".into();
            s
        },
        "not base64",
        |_| {},
    )
    .await;
    a_bad_state_is_refused(|_| json!({"files": "ESCAPED"}), "is not one", |_| {}).await;
}

#[tokio::test]
async fn real_claude_another_sessions_state_is_refused() {
    a_bad_state_is_refused(
        |_| planted_state("another-session", &[("another-session.jsonl", "ESCAPED")]),
        "another-session",
        |_| {},
    )
    .await;
}

/// A link where the CLI's project directory goes (planted in the new
/// sandbox's state directory) is never followed: the restore is refused.
#[tokio::test]
async fn real_claude_a_link_on_the_way_of_a_restore_is_refused() {
    let elsewhere = Path::new("/tmp/hosted-boot-escape");
    let _ = std::fs::remove_dir_all(elsewhere);
    std::fs::create_dir_all(elsewhere).unwrap();
    a_bad_state_is_refused(
        |sid| planted_state(sid, &[(&format!("{sid}.jsonl"), "ESCAPED")]),
        "cannot open",
        |home| {
            let projects = home.join(".claude/projects");
            std::fs::create_dir_all(&projects).unwrap();
            let root = std::fs::canonicalize(home.join("root"))
                .unwrap()
                .join("repo");
            let name = hosted_boot::agent::state::claude_project_name(&root.to_string_lossy());
            std::os::unix::fs::symlink(elsewhere, projects.join(name)).unwrap();
        },
    )
    .await;
    // The CLI's fresh session may write through the link (its own doing);
    // the restore wrote nothing there.
    assert!(
        !elsewhere
            .join("3f0c5b2e-8d4a-4c1e-9b7a-2a6f1e0d9c4b.jsonl")
            .exists()
    );
    let _ = std::fs::remove_dir_all(elsewhere);
}

/// Issue 39, a stop during the save: SIGTERM while the coordinator holds
/// the save's request. The save is cut, the run is sealed within the stop
/// budget (the save never delays the seal), and the state is saved again
/// after the seal with what the budget leaves.
#[tokio::test]
async fn real_claude_a_stop_during_the_save_seals_first_and_saves_after() {
    use hosted_boot_coordinator::{Fault, Route};
    let Some(case) = Case::start("claude", "write:one.txt").await else {
        return;
    };
    case.sb
        .coordinator
        .add_fault(Fault::delay(Route::AgentStateSave, Duration::from_secs(30)))
        .unwrap();
    let runner = Runner::spawn(&mut case.command());
    let held = case
        .sb
        .coordinator
        .wait_for(TURN_WAIT, |s| {
            !s.requests_to(Route::AgentStateSave).is_empty()
        })
        .await;
    assert!(held.is_ok(), "no save came: {}", runner.output());
    super::support::signal(runner.pid(), rustix::process::Signal::TERM);
    let started = std::time::Instant::now();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(143), "{output}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the held save delayed the stop: {:?}",
        started.elapsed()
    );
    let snap = case.sb.coordinator.snapshot();
    let run = snap.run("run-1").unwrap();
    assert!(run.finish.is_some(), "run-1 was not sealed: {output}");
    let saves = snap.requests_to(Route::AgentStateSave);
    assert_eq!(saves.len(), 2, "the save after the seal: {output}");
    let sealed_at = snap
        .requests_to(Route::Finish)
        .first()
        .map(|r| r.at_ms)
        .unwrap();
    assert!(saves[1].at_ms > sealed_at);
    assert!(snap.agent_state.is_some(), "{output}");
    assert_nothing_left(&case.sb.root()).await;
}

/// Issue 40: the agent gets its `agent` span's trace context
/// (`TRACEPARENT`), and Claude Code, with its own tracing on
/// (`CLAUDE_CODE_ENABLE_TELEMETRY`, `CLAUDE_CODE_ENHANCED_TELEMETRY_BETA`,
/// `OTEL_TRACES_EXPORTER=otlp`: the platform's choice, passed through as
/// every `OTEL_*` variable is), continues it: its spans are in the turn's
/// trace, its `claude_code.interaction` a child of the runner's `agent`.
#[cfg(feature = "otel")]
#[tokio::test]
async fn real_claude_joins_the_turns_trace() {
    let Some(case) = Case::start("claude", "write:one.txt").await else {
        return;
    };
    let (endpoint, received) = super::telemetry::receiver(true).await;
    let mut cmd = case.command();
    cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("OTEL_TRACES_EXPORTER", "otlp")
        .env("OTEL_METRICS_EXPORTER", "none")
        .env("OTEL_LOGS_EXPORTER", "none")
        .args(["--agent-env", "CLAUDE_CODE_ENABLE_TELEMETRY=1"])
        .args(["--agent-env", "CLAUDE_CODE_ENHANCED_TELEMETRY_BETA=1"]);
    let mut runner = Runner::spawn(&mut cmd);
    case.sealed(&mut runner, "run-1").await;
    case.sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    let spans = super::telemetry::spans(&received);
    let agent = spans
        .iter()
        .find(|s| s.name == "agent")
        .unwrap_or_else(|| panic!("no agent span: {spans:#?}"));
    let claude: Vec<_> = spans
        .iter()
        .filter(|s| s.name.starts_with("claude_code."))
        .collect();
    let names: Vec<&str> = claude.iter().map(|s| s.name.as_str()).collect();
    assert!(
        claude.iter().all(|s| s.trace_id == agent.trace_id),
        "Claude Code's spans outside the turn's trace {}: {claude:#?}",
        super::telemetry::hex(&agent.trace_id)
    );
    assert!(
        claude
            .iter()
            .any(|s| s.name == "claude_code.interaction" && s.parent_span_id == agent.span_id),
        "no claude_code.interaction under the agent span: {names:?}"
    );
}
