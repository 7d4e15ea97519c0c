//! Agent adapters (the one planned extension point): one module per agent
//! CLI, each an [`Adapter`] that says what to start ([`Launch`]) and then
//! speaks the CLI's protocol over its stdin, its output lines (and, for
//! `opencode serve`, HTTP), reporting what it saw as an [`Observation`].
//! [`drive`] runs one turn's agent under the supervisor with the watchdogs,
//! the two-stage interrupt and the overload continuation, and turns the
//! observation into a [`TurnOutcome`] (PROTOCOL.md 4.1 step 4, 2.6).
//!
//! Adding an adapter: a module with an [`Adapter`], a variant of
//! [`AgentKind`] (and in [`AgentKind::ALL`], which the compiler does not
//! check), an arm in [`adapter_for`] and in [`env::hygiene`] and
//! [`env::missing_key`], a stand-in CLI under `tests/fakes/` and its tests
//! (README, "Adding an adapter").

pub mod acp;
pub mod classify;
pub mod claude;
pub mod codex;
pub mod codex_exec;
pub mod command;
pub mod drive;
pub mod env;
pub mod jsonrpc;
pub mod lenient;
pub mod opencode;
pub mod opencode_run;
pub mod sse;
pub mod state;
pub mod usage;
mod watchdog;

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::mpsc;

use crate::events::EventSender;
use crate::process::output::LineReceiver;
use crate::redact::Redactor;
use crate::wire::{ClientInfo, ErrorCode, RunOutcome};
pub use usage::Usage;

/// The agents `--agent` accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentKind {
    /// Any program (`--agent-command`), NDJSON or text on stdout.
    Command,
    /// Claude Code: `claude -p` with stream-json in and out.
    Claude,
    /// Codex: `codex app-server` (JSON-RPC over stdio).
    Codex,
    /// Codex fallback: `codex exec --json`.
    CodexExec,
    /// opencode: `opencode serve` (HTTP and an event stream).
    OpenCode,
    /// opencode fallback: `opencode run --format json`.
    OpenCodeRun,
    /// Any agent that speaks the Agent Client Protocol
    /// (`--agent-command`): JSON-RPC over stdio.
    Acp,
}

impl AgentKind {
    /// Every kind, in the order the help lists them.
    pub const ALL: [AgentKind; 7] = [
        AgentKind::Claude,
        AgentKind::Codex,
        AgentKind::CodexExec,
        AgentKind::OpenCode,
        AgentKind::OpenCodeRun,
        AgentKind::Acp,
        AgentKind::Command,
    ];

    /// The name `--agent` takes.
    pub fn name(self) -> &'static str {
        match self {
            AgentKind::Command => "command",
            AgentKind::Claude => "claude",
            AgentKind::Codex => "codex",
            AgentKind::CodexExec => "codex-exec",
            AgentKind::OpenCode => "opencode",
            AgentKind::OpenCodeRun => "opencode-run",
            AgentKind::Acp => "acp",
        }
    }

    /// The kind named `name`, if any.
    pub fn from_name(name: &str) -> Option<AgentKind> {
        AgentKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The program run when `--agent-command` does not name another one;
    /// `None` for `command` and `acp`, which need it.
    pub fn default_program(self) -> Option<&'static str> {
        match self {
            AgentKind::Command | AgentKind::Acp => None,
            AgentKind::Claude => Some("claude"),
            AgentKind::Codex | AgentKind::CodexExec => Some("codex"),
            AgentKind::OpenCode | AgentKind::OpenCodeRun => Some("opencode"),
        }
    }
}

/// Durations of the agent's watchdogs and continuations; scaled by
/// `HOSTED_BOOT_TEST_TIME_SCALE` like every contract duration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AgentTimings {
    /// No output for this long → interrupt, fail `agent_hung`
    /// (`--agent-idle-timeout`, 10 min; `None`: off).
    pub idle_timeout: Option<Duration>,
    /// Terminal event seen, process still alive after this → stop the tree,
    /// keep the outcome (10 s).
    pub terminal_grace: Duration,
    /// A server-mode CLI (`opencode serve`) is stopped this long after its
    /// terminal event, so that late usage events still arrive (500 ms).
    pub server_settle: Duration,
    /// Waits before the first and the second overload continuation (5 s, 15 s).
    pub overload_delays: [Duration; 2],
    /// Bound on `<cli> --version` for the `hosted_boot.runner` event (30 s;
    /// started at boot, never awaited by the agent's start, see
    /// [`drive::start_version_probe`]).
    pub version_timeout: Duration,
    /// Bound on a server-mode CLI becoming healthy (60 s).
    pub server_ready: Duration,
}

impl Default for AgentTimings {
    fn default() -> Self {
        AgentTimings {
            idle_timeout: Some(Duration::from_secs(600)),
            terminal_grace: Duration::from_secs(10),
            server_settle: Duration::from_millis(500),
            overload_delays: [Duration::from_secs(5), Duration::from_secs(15)],
            version_timeout: Duration::from_secs(30),
            server_ready: Duration::from_secs(60),
        }
    }
}

impl AgentTimings {
    /// Every duration multiplied by `factor` (> 0).
    pub fn scaled(self, factor: f64) -> Self {
        let s = |d: Duration| Duration::from_secs_f64(d.as_secs_f64() * factor);
        AgentTimings {
            idle_timeout: self.idle_timeout.map(s),
            terminal_grace: s(self.terminal_grace),
            server_settle: s(self.server_settle),
            overload_delays: [s(self.overload_delays[0]), s(self.overload_delays[1])],
            // Starting a real program and a loopback server take what they
            // take; a scaled bound would only make tests flaky.
            version_timeout: self.version_timeout,
            server_ready: self.server_ready,
        }
    }
}

/// The agent to run: what `--agent`, `--agent-command`, `--agent-arg`,
/// `--agent-env` and `--agent-idle-timeout` say.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentConfig {
    /// Which adapter.
    pub kind: AgentKind,
    /// The program (looked up on `PATH` when it has no slash): the first
    /// word of `--agent-command`, or the CLI's name.
    pub program: String,
    /// The other words of `--agent-command`: the `command` agent's
    /// arguments, or for a CLI arguments before the adapter's own (a
    /// launcher such as `npx -y @anthropic-ai/claude-code`).
    pub args: Vec<String>,
    /// `--agent-arg`s: literal arguments after the adapter's own.
    pub extra_args: Vec<String>,
    /// Literal environment added last (`--agent-env`); never `ORIZU_*`.
    pub env: Vec<(String, String)>,
    /// `ORIZU_OPENCODE_PORT`: the port `opencode serve` listens on.
    pub opencode_port: Option<u16>,
    /// Watchdogs and continuation delays.
    pub timings: AgentTimings,
    /// `--agent-user`: the user every process of the agent runs as (the
    /// runner is root); `None`: the runner's own user.
    pub user: Option<crate::agent_user::AgentUser>,
    /// The wrap-up before a turn's time cap; `None`: off.
    pub wrap_up: Option<WrapUp>,
    /// `--acp-permissions`: how an ACP agent's permission requests are
    /// answered.
    pub acp_permissions: AcpPermissions,
}

/// How the `acp` adapter answers `session/request_permission`
/// (`--acp-permissions`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum AcpPermissions {
    /// Granted, as the other adapters run their CLIs in bypass mode: the
    /// agent's "allow once" option, else its "allow always"; and a mode
    /// that runs tools unasked is set when the agent offers one.
    #[default]
    Allow,
    /// Refused: the agent's "reject once" option, else its "reject
    /// always", else cancelled; a mode that asks is set when the agent
    /// offers one (its own default need not ask).
    Reject,
}

/// A message sent to the agent mid-turn, a while before the turn's time cap
/// (`clientInfo.durationMinutes`), so that it can commit and summarise
/// before it is interrupted (PROTOCOL.md 4.1 step 4): to adapters whose CLI
/// takes a message mid-turn ([`Launch::wrap_up`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrapUp {
    /// How long before the time cap (`--wrap-up-before`).
    pub before: Duration,
    /// The message (`--wrap-up-message`).
    pub message: String,
}

/// `--wrap-up-message`'s default.
pub const DEFAULT_WRAP_UP_MESSAGE: &str = "This turn's time is nearly up and you will be \
interrupted soon. Stop starting new work: commit what you have, then summarise what is done \
and what is left.";

impl AgentConfig {
    /// A `command` agent with default timings (unit tests).
    #[cfg(test)]
    pub(crate) fn command(program: impl Into<String>, args: Vec<String>) -> Self {
        AgentConfig {
            kind: AgentKind::Command,
            program: program.into(),
            args,
            extra_args: Vec::new(),
            env: Vec::new(),
            opencode_port: None,
            timings: AgentTimings::default(),
            user: None,
            wrap_up: None,
            acp_permissions: AcpPermissions::Allow,
        }
    }

    /// The agent's name as configured (`claude`, `command`, …).
    pub fn name(&self) -> &'static str {
        self.kind.name()
    }
}

/// What the agent keeps from one turn to the next within a boot: the agent
/// session to resume (the coordinator's `agentSessionId` at first, then the
/// id each turn reports), the model and effort of `clientInfo`, and the
/// CLI's version (asked once).
#[derive(Debug, Default)]
pub struct AgentSession {
    resume: Mutex<Option<String>>,
    /// `clientInfo.model`.
    pub model: Option<String>,
    /// `clientInfo.reasoningEffort`.
    pub effort: Option<String>,
    version: tokio::sync::OnceCell<Option<String>>,
    /// `codex exec` reports the thread's running token total: the last one
    /// seen, per thread, so that a turn reports only its own.
    cumulative: Mutex<Option<(String, Usage)>>,
}

impl AgentSession {
    /// The state at boot, from the session (2.4).
    pub fn new(client_info: &ClientInfo, agent_session_id: Option<String>) -> Self {
        AgentSession {
            resume: Mutex::new(agent_session_id.filter(|s| !s.is_empty())),
            model: client_info.model.clone().filter(|s| !s.is_empty()),
            effort: client_info
                .reasoning_effort
                .clone()
                .filter(|s| !s.is_empty()),
            version: tokio::sync::OnceCell::new(),
            cumulative: Mutex::new(None),
        }
    }

    /// The agent session id to resume, if any.
    pub fn resume_id(&self) -> Option<String> {
        crate::concurrency::lock(&self.resume).clone()
    }

    /// Records the id the agent reported; returns the previous one.
    pub fn set_resume_id(&self, id: String) -> Option<String> {
        crate::concurrency::lock(&self.resume).replace(id)
    }

    /// Forgets the session to resume (the CLI refused it); returns it.
    pub fn forget_resume_id(&self) -> Option<String> {
        crate::concurrency::lock(&self.resume).take()
    }

    /// The last running total recorded for `thread`.
    pub fn cumulative_for(&self, thread: &str) -> Option<Usage> {
        crate::concurrency::lock(&self.cumulative)
            .as_ref()
            .filter(|(t, _)| t == thread)
            .map(|(_, u)| u.clone())
    }

    /// Records the running total of `thread`.
    pub fn set_cumulative(&self, thread: String, total: Usage) {
        *crate::concurrency::lock(&self.cumulative) = Some((thread, total));
    }

    /// Forgets the running total: a turn ended without one (an
    /// interrupted `codex exec` prints no `turn.completed`), so the next
    /// total includes tokens no turn reported, and is left out.
    pub fn forget_cumulative(&self) {
        *crate::concurrency::lock(&self.cumulative) = None;
    }

    /// The CLI's version if the probe has answered (`Some(None)`: it
    /// answered nothing usable), `None` while it runs or before it starts.
    pub fn known_version(&self) -> Option<Option<String>> {
        self.version.get().cloned()
    }

    /// The CLI's version, computed once by `probe`.
    pub async fn version<F>(&self, probe: F) -> Option<String>
    where
        F: std::future::Future<Output = Option<String>>,
    {
        self.version.get_or_init(|| probe).await.clone()
    }
}

/// How a turn ended, as the runner reports it in `finish` (2.6).
#[derive(Clone, Debug, PartialEq)]
pub struct TurnOutcome {
    /// The terminal status.
    pub status: RunOutcome,
    /// The agent's own session id, when known (`finish.agentSessionId`).
    pub agent_session_id: Option<String>,
    /// Why it failed.
    pub error: Option<AgentError>,
    /// Token usage of the turn (`finish.usage`, PROTOCOL.md 2.6).
    pub usage: Option<crate::wire::Usage>,
    /// The resume the CLI refused before the turn ran in a fresh agent
    /// session (`finish.agentSessionReset`).
    pub session_reset: Option<crate::wire::AgentSessionReset>,
    /// What the agent's processes used (`finish.resources`).
    pub resources: Option<crate::wire::Resources>,
}

/// A failure class of the turn; `code` maps one to one onto the wire codes
/// of PROTOCOL.md 2.6 (`finish.error`).
#[derive(Clone, Debug, PartialEq)]
pub struct AgentError {
    /// The wire code.
    pub code: ErrorCode,
    /// What happened (redacted and cut to 800 characters when sent).
    pub message: String,
    /// Whether the coordinator may retry (only `provider_rate_limited`).
    pub retryable: bool,
    /// The wait the agent suggested, in milliseconds.
    pub retry_after_ms: Option<u64>,
    /// When the limit resets, RFC 3339 (UTC).
    pub resets_at: Option<String>,
}

impl AgentError {
    /// An error of class `code`; `retryable` follows the code.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        AgentError {
            code,
            message: message.into(),
            retryable: code.retryable(),
            retry_after_ms: None,
            resets_at: None,
        }
    }

    /// With the agent's suggested wait.
    pub fn retry_after(mut self, ms: Option<u64>) -> Self {
        self.retry_after_ms = ms;
        self
    }

    /// With the reset time, given in Unix seconds.
    pub fn resets_at_unix(mut self, secs: Option<f64>) -> Self {
        self.resets_at = secs.and_then(classify::rfc3339_from_unix);
        self
    }
}

impl TurnOutcome {
    /// A turn that ended `interrupted`.
    pub fn interrupted() -> Self {
        TurnOutcome {
            status: RunOutcome::Interrupted,
            agent_session_id: None,
            error: None,
            usage: None,
            session_reset: None,
            resources: None,
        }
    }

    /// A turn that `failed` with `code`.
    pub fn failed(code: ErrorCode, message: impl Into<String>) -> Self {
        TurnOutcome::failed_with(AgentError::new(code, message))
    }

    /// A turn that `failed` with `error`.
    pub fn failed_with(error: AgentError) -> Self {
        TurnOutcome {
            status: RunOutcome::Failed,
            agent_session_id: None,
            error: Some(error),
            usage: None,
            session_reset: None,
            resources: None,
        }
    }

    /// A turn that `succeeded`.
    pub fn succeeded() -> Self {
        TurnOutcome {
            status: RunOutcome::Succeeded,
            agent_session_id: None,
            error: None,
            usage: None,
            session_reset: None,
            resources: None,
        }
    }
}

/// What the agent's own events said about the end of its turn.
#[derive(Clone, Debug, PartialEq)]
pub enum Terminal {
    /// The turn completed.
    Completed,
    /// The turn failed, classified.
    Failed(AgentError),
    /// The agent aborted the turn (after an interrupt).
    Aborted,
}

/// How the process exit counts when there is no terminal event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitRule {
    /// `command`: exit 0 succeeds; anything else is `agent_crashed`.
    Command,
    /// A CLI with a terminal event: without one the turn failed; the stderr
    /// tail is classified as text, else `agent_crashed`.
    NeedsTerminal,
    /// A CLI whose clean exit is its terminal event (`opencode run` before
    /// its `done` event existed): exit 0 without a failure succeeds.
    ZeroSucceeds,
}

/// Whether the turn's own events prove it had no effects (overload
/// continuation, issue "Overload continuation").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Effects {
    /// Only messages and reasoning were seen.
    #[default]
    None,
    /// A tool call, command or file change was seen.
    Some,
    /// The adapter cannot tell (the `command` agent).
    Unknown,
}

/// What an adapter saw during one agent process.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observation {
    /// The terminal event, if one came.
    pub terminal: Option<Terminal>,
    /// A classified failure seen without a terminal event (a refused
    /// resume, an error event before the process died).
    pub failure: Option<AgentError>,
    /// Usage of this process's part of the turn.
    pub usage: Usage,
    /// Effects seen.
    pub effects: Effects,
}

/// What to write to the agent's stdin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StdinMode {
    /// These bytes, then EOF (the prompt).
    Bytes(Vec<u8>),
    /// The protocol channel: the adapter writes and closes it.
    Channel,
}

/// What to start for one agent process.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    /// Arguments after the program (the adapter's, then `--agent-arg`s).
    pub args: Vec<String>,
    /// Variables this process needs beyond the adapter's fixed ones (the
    /// opencode server password), set last.
    pub env: Vec<(String, crate::secret::Secret)>,
    /// Stdin.
    pub stdin: StdinMode,
    /// Whether the adapter has a protocol interrupt (tried before signals).
    pub protocol_interrupt: bool,
    /// A server that does not exit by itself after its terminal event.
    pub server: bool,
    /// How the exit counts without a terminal event.
    pub exit_rule: ExitRule,
    /// The first stop signal to the process group (PROTOCOL.md 4.1, 4.4):
    /// SIGINT, but SIGTERM for opencode, whose `serve` does not exit on
    /// SIGINT and whose `run` ignores one while a tool runs (1.18.33).
    pub stop_signal: rustix::process::Signal,
    /// Whether the CLI takes a message mid-turn, so that the wrap-up
    /// ([`WrapUp`], [`AdapterCommand::WrapUp`]) can be sent to it.
    pub wrap_up: bool,
}

/// A request from the runner ([`drive`]) to an adapter.
///
/// One of three interrupt types, one per hop, because each decides
/// something different: [`drive::RunRequest`] (the coordinator asked; it
/// alone, with a stop, makes the outcome `interrupted`), this one (stage one
/// of the two-stage interrupt: ask the CLI, decides nothing) and
/// [`crate::process::supervisor::Control`] (stage two: signals to the
/// process group). The idle watchdog, a stop and an adapter's give-up send
/// this without any `RunRequest`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdapterCommand {
    /// Interrupt the turn through the CLI's own protocol (Claude's control
    /// request, Codex's `turn/interrupt`, opencode's abort).
    ProtocolInterrupt,
    /// Send the turn's wrap-up message ([`TurnSpec::wrap_up`]) to the CLI,
    /// unless its turn already ended; only to an adapter whose
    /// [`Launch::wrap_up`] says it can.
    WrapUp,
}

/// What an adapter tells the runner while the agent runs.
#[derive(Clone, Debug, PartialEq)]
pub enum Note {
    /// The agent's session id, from the first event that carries it.
    SessionId(String),
    /// The terminal event came (the runner stops a process that lingers).
    Terminal,
    /// The terminal event came and the process must not run on (a message
    /// it has not taken yet would start another turn): its tree is stopped
    /// now.
    TerminalStopNow,
    /// The wrap-up message was written to the CLI.
    WrapUpSent,
    /// Output that does not come as a line (an event stream): counts for
    /// the idle watchdog.
    Activity,
    /// Give up on the turn: interrupt the agent and fail with this error
    /// (a server that never became healthy, a retry loop on a dead quota).
    Abort(AgentError),
}

/// An adapter's channels.
pub struct AdapterIo {
    /// The agent's output lines, until the process has exited and its pipes
    /// are drained (then the channel closes and the adapter returns).
    pub lines: LineReceiver,
    /// The agent's stdin in [`StdinMode::Channel`]; dropping it closes stdin.
    pub stdin: Option<mpsc::UnboundedSender<Vec<u8>>>,
    /// Requests from the runner.
    pub commands: mpsc::UnboundedReceiver<AdapterCommand>,
    /// To the runner.
    pub notes: mpsc::UnboundedSender<Note>,
    /// The run's events (redacted by the sink).
    pub events: EventSender,
}

impl AdapterIo {
    /// Writes one JSON line to stdin; false when stdin is closed.
    pub fn send_json(&self, value: &impl serde::Serialize) -> bool {
        let Some(stdin) = &self.stdin else {
            return false;
        };
        // Only a map with keys that are no strings fails, and the runner
        // writes none.
        let Ok(mut bytes) = serde_json::to_vec(value) else {
            return false;
        };
        bytes.push(b'\n');
        stdin.send(bytes).is_ok()
    }

    /// Tells the runner `note` (ignored once the runner stopped listening).
    pub fn note(&self, note: Note) {
        let _ = self.notes.send(note);
    }
}

/// One turn's adapter for one agent process: the one planned extension
/// point (one implementation per [`AgentKind`]).
pub trait Adapter: Send {
    /// What to start.
    fn launch(&self) -> Launch;
    /// Takes the values `started` (a process started ahead of its turn,
    /// [`drive::Prestarted`]) was made with for itself alone (the opencode
    /// server's password), so that this adapter's [`Adapter::launch`]
    /// matches it and the adapter can speak to it. Adapters without such
    /// values have nothing to take.
    fn adopt(&mut self, _started: &Launch) {}
    /// What a process started ahead of its turn does while it waits, sending
    /// it no prompt: opencode serve loads its configuration (and with it its
    /// plugins) and provider package, which its first prompt would
    /// otherwise wait for. It reads the process's output from `lines` and gives the
    /// receiver back, with every line it read put back, once done or at
    /// once when `done` fires (the turn has come). Default: nothing.
    fn warm_up(
        &self,
        lines: LineReceiver,
        _done: tokio::sync::oneshot::Receiver<()>,
    ) -> BoxFuture<'static, LineReceiver> {
        Box::pin(std::future::ready(lines))
    }
    /// Speaks the CLI's protocol until the output ends.
    fn run(self: Box<Self>, io: AdapterIo) -> BoxFuture<'static, Observation>;
}

/// What an adapter needs to know about the turn.
#[derive(Clone, Debug)]
pub struct TurnSpec {
    /// The prompt: it travels through stdin or the protocol, never argv.
    pub prompt: String,
    /// `repo/`, the same for every turn (resume is tied to it).
    pub cwd: PathBuf,
    /// The agent session to resume.
    pub resume: Option<String>,
    /// The model (`clientInfo.model`).
    pub model: Option<String>,
    /// The reasoning effort (`clientInfo.reasoningEffort`).
    pub effort: Option<String>,
    /// Arguments after the adapter's own: `--agent-arg`s (for `command`,
    /// all of its arguments).
    pub extra_args: Vec<String>,
    /// `ORIZU_OPENCODE_PORT`.
    pub opencode_port: Option<u16>,
    /// Watchdog bounds.
    pub timings: AgentTimings,
    /// The platform's instructions, when the boot has any.
    pub instructions: Option<Instructions>,
    /// The wrap-up message, when the boot sends one ([`WrapUp`]).
    pub wrap_up: Option<String>,
    /// `--acp-permissions`.
    pub acp_permissions: AcpPermissions,
}

/// The platform's instructions for the agent (the session's
/// `instructions`, or `--instructions-file`; PROTOCOL.md 3, "The
/// platform's instructions"). Each adapter passes them its CLI's own way:
/// `claude --append-system-prompt-file`, Codex's `developerInstructions`
/// (app-server) or `-c developer_instructions` (`exec`), opencode's prompt
/// `system` (server) or `instructions` in `OPENCODE_CONFIG_CONTENT` (`run`),
/// and for every agent `ORIZU_INSTRUCTIONS_FILE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instructions {
    /// The text.
    pub text: String,
    /// The same text in a file outside `repo/`, readable by the agent
    /// user: for the agent's environment (`ORIZU_INSTRUCTIONS_FILE`), the
    /// turn's run directory's; for the CLI's own arguments, the session
    /// directory's, one path for the boot (so that a CLI started ahead of
    /// its turn is started as the turn would start it).
    pub file: PathBuf,
}

/// The variable naming the instructions file in the agent's environment.
pub const INSTRUCTIONS_FILE_VAR: &str = "ORIZU_INSTRUCTIONS_FILE";

/// The adapter of `kind` for one agent process of a turn. Secrets it makes
/// (the opencode server password) go to `redactor` first.
pub fn adapter_for(
    config: &AgentConfig,
    spec: TurnSpec,
    session: &std::sync::Arc<AgentSession>,
    redactor: &Redactor,
) -> Box<dyn Adapter> {
    match config.kind {
        AgentKind::Command => Box::new(command::CommandAdapter::new(spec)),
        AgentKind::Claude => Box::new(claude::ClaudeAdapter::new(spec)),
        AgentKind::Codex => Box::new(codex::CodexAdapter::new(spec)),
        AgentKind::CodexExec => Box::new(codex_exec::CodexExecAdapter::new(spec, session.clone())),
        AgentKind::OpenCode => Box::new(opencode::OpenCodeAdapter::new(spec, redactor)),
        AgentKind::OpenCodeRun => Box::new(opencode_run::OpenCodeRunAdapter::new(spec)),
        AgentKind::Acp => Box::new(acp::AcpAdapter::new(spec)),
    }
}
