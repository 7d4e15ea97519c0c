//! One turn's agent (PROTOCOL.md 4.1 step 4): the adapter, the
//! process under the supervisor, and around them
//!
//! - the **interrupt in two stages**: the CLI's own protocol first (Claude's
//!   control request, Codex's `turn/interrupt`, opencode's abort), then,
//!   after half the grace period, SIGINT to the tree and SIGKILL at the end
//!   of the grace (adapters without a protocol get the signals at once); the
//!   runner, not the exit status, decides `interrupted`;
//! - the **idle watchdog**: no output line (or event) for
//!   `--agent-idle-timeout` → interrupt, `failed` with `agent_hung`;
//! - the **terminal watchdog**: the terminal event came but the process is
//!   still alive after 10 s (a server at once) → stop its tree, keep the
//!   outcome;
//! - the **agent session**: the id of the first event that carries it is
//!   recorded at once (a `hosted_boot.agent_session` event) and resumed on
//!   the next turn;
//! - the **overload continuation**: a turn that failed `provider_overloaded`
//!   and whose events prove it had no effect is continued in the same agent
//!   session after 5 s, then 15 s, at most twice.
//!
//! The interrupt's stages and both watchdogs are the clocks of one type
//! (`agent/watchdog.rs`). Each agent process of [`run`] goes through the
//! same steps: start the adapter on its channels, start the process under
//! the supervisor, relay requests, stops, notes and alarms (one handler per
//! select arm) until it exits, collect the adapter's observation, and
//! decide the outcome (`outcome_of`: the runner's own evidence first).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::usage::Totals;
use super::watchdog::Watchdog;
use super::{
    Adapter, AdapterCommand, AdapterIo, AgentConfig, AgentError, AgentKind, AgentSession, Effects,
    ExitRule, Launch, Note, Observation, StdinMode, Terminal, TurnOutcome, TurnSpec, Usage,
    adapter_for, classify, command, env,
};
use crate::events::EventSender;
use crate::events::event::RunnerEvent;
use crate::process::lines::Line;
use crate::process::output::{ChannelSink, LineReceiver};
use crate::process::supervisor::{self, Exit, SpawnError, SpawnSpec, Stream};
use crate::redact::Redactor;
use crate::signals::Stop;
use crate::timings::Timings;
use crate::wire::ErrorCode;

/// The prompt of an overload continuation.
pub const CONTINUE_PROMPT: &str = "The model was overloaded and your last reply was cut short. \
Continue the same task from its current state.";

/// At most this many overload continuations per turn.
pub const MAX_CONTINUATIONS: usize = 2;

/// Reads (batches of lines) queued between an output stream's reader and
/// the adapter; beyond this the reader waits (a read is 64 KiB, plus at most
/// one line of up to 1 MiB completed by it).
const LINE_QUEUE: usize = 4;

/// What the turn asks of its agent.
pub struct DriveInput {
    /// The agent.
    pub config: AgentConfig,
    /// What the agent keeps across turns.
    pub session: Arc<AgentSession>,
    /// The prompt.
    pub prompt: String,
    /// `repo/`.
    pub cwd: PathBuf,
    /// The agent's environment (the contract's, with the turn's variables).
    pub env: Vec<(OsString, OsString)>,
    /// The run's events.
    pub events: EventSender,
    /// Secrets the adapter makes are added here.
    pub redactor: Redactor,
    /// Interrupt and stop graces, the pipe drain.
    pub timings: Timings,
    /// How the agent's processes are supervised (drain, time cap, cgroup).
    pub supervision: crate::process::supervisor::Supervision,
    /// The platform's instructions, written for this turn.
    pub instructions: Option<super::Instructions>,
    /// The agent started ahead of this turn, if any: its first process when
    /// compatible, else discarded.
    pub prestarted: std::sync::Mutex<Option<Prestarted>>,
}

impl DriveInput {
    /// What starting one of this turn's agent processes needs.
    fn process(&self) -> AgentProcess<'_> {
        AgentProcess {
            config: &self.config,
            session: &self.session,
            cwd: &self.cwd,
            redactor: &self.redactor,
            supervision: &self.supervision,
        }
    }
}

/// What starting one agent process needs: the same for a turn's process
/// and one started ahead of its turn ([`prestart`]).
#[derive(Clone, Copy)]
pub struct AgentProcess<'a> {
    /// The agent.
    pub config: &'a AgentConfig,
    /// What the agent keeps across turns (the session to resume).
    pub session: &'a Arc<AgentSession>,
    /// `repo/`.
    pub cwd: &'a std::path::Path,
    /// Secrets the adapter makes are added here.
    pub redactor: &'a Redactor,
    /// How the agent's processes are supervised.
    pub supervision: &'a crate::process::supervisor::Supervision,
}

/// A request about the run from the coordinator, relayed by the turn's
/// interrupt watch to its agent. Not [`AdapterCommand`] (which any of the
/// runner's reasons to stop the CLI sends) nor `supervisor::Control` (the
/// signals): only this request, or a stop, makes the outcome `interrupted`
/// (PROTOCOL.md 4.1 step 4); see [`AdapterCommand`] for the three hops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunRequest {
    /// `interruptRequestedRunId` named this run (the watch saw it).
    Interrupt,
}

/// How the agent's part of the turn ended.
#[derive(Debug)]
pub struct Driven {
    /// The outcome to seal.
    pub outcome: TurnOutcome,
    /// The stop signal that ended it, if one did.
    pub stopped_by: Option<Stop>,
}

/// Runs the agent for one turn (continuations included) and decides the
/// outcome.
pub async fn run(
    input: DriveInput,
    requests: &mut mpsc::UnboundedReceiver<RunRequest>,
    stop: &mut watch::Receiver<Stop>,
) -> Driven {
    let mut flags = Flags::default();
    let mut usage = Usage::default();
    let mut used = Used::default();
    let mut prompt = input.prompt.clone();
    let mut continuations = 0;
    let mut reset = None;
    loop {
        let resume = input.session.resume_id();
        let once = match run_once(
            &input,
            prompt.clone(),
            resume.clone(),
            requests,
            stop,
            &mut flags,
        )
        .await
        {
            Ok(once) => once,
            Err(e) => {
                tracing::error!(error = %e, "agent spawn failed");
                input.events.emit(
                    RunnerEvent::SpawnFailed,
                    json!({"program": e.program, "error": e.reason}),
                );
                let outcome = TurnOutcome {
                    session_reset: reset,
                    ..TurnOutcome::failed(ErrorCode::AgentSpawnFailed, e.to_string())
                };
                return finish(&input, outcome, &usage, &used, &flags);
            }
        };
        usage.add(&once.observation.usage);
        used.add(once.exit.usage);
        let mut outcome = outcome_of(&input.config, &once, &flags, resume.is_some());
        outcome.session_reset.clone_from(&reset);
        if reset.is_none()
            && let Some(requested) = resume.as_deref()
            && let Some(refused) = refused_resume(&outcome, &once, &flags)
        {
            reset = Some(reset_session(&input, requested, refused));
            prompt = input.prompt.clone();
            continue;
        }
        let overloaded = outcome
            .error
            .as_ref()
            .is_some_and(|e| e.code == ErrorCode::ProviderOverloaded);
        let continuable = overloaded
            && input.config.kind != AgentKind::Command
            && once.observation.effects == Effects::None
            && continuations < MAX_CONTINUATIONS
            && !flags.interrupted()
            && input.session.resume_id().is_some();
        if overloaded && !continuable {
            tracing::info!(
                effects = match once.observation.effects {
                    Effects::None => "none seen",
                    Effects::Some => "a tool call, command or file change",
                    Effects::Unknown => "unknown",
                },
                continuations,
                "provider overloaded; the failure stands"
            );
        }
        if !continuable {
            return finish(&input, outcome, &usage, &used, &flags);
        }
        let delay = input.config.timings.overload_delays[continuations];
        continuations += 1;
        input.events.emit(
            RunnerEvent::OverloadContinuation,
            json!({
                "attempt": continuations,
                "delayMs": u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                "agentSessionId": input.session.resume_id(),
            }),
        );
        tracing::warn!(
            attempt = continuations,
            delay = %humantime::format_duration(delay),
            "provider overloaded and the turn had no effect; continuing it in the same agent session"
        );
        if !wait_unless_stopped(delay, requests, stop, &mut flags).await {
            return finish(&input, TurnOutcome::interrupted(), &usage, &used, &flags);
        }
        prompt = CONTINUE_PROMPT.to_string();
    }
}

/// The CLI has no state for the session it was to resume (a new sandbox,
/// its state directories lost): the turn runs once more in a fresh agent
/// session rather than failing (issue 39). Forgets the id, says so.
fn reset_session(
    input: &DriveInput,
    requested: &str,
    refused: String,
) -> crate::wire::AgentSessionReset {
    input.session.forget_resume_id();
    let note = crate::wire::AgentSessionReset {
        requested: requested.to_string(),
        reason: refused,
    };
    input.events.emit(
        RunnerEvent::AgentSessionReset,
        serde_json::to_value(&note).unwrap_or_default(),
    );
    tracing::warn!(
        requested,
        reason = %note.reason,
        "the agent CLI has no state for the session to resume; running the turn in a fresh agent session"
    );
    note
}

/// The CLI's words when it refused to resume its session and did nothing
/// else (no tool call, command or file change seen), unless the runner
/// interrupted or stopped it.
fn refused_resume(outcome: &TurnOutcome, once: &Once, flags: &Flags) -> Option<String> {
    let error = outcome.error.as_ref()?;
    (error.code == ErrorCode::ResumeFailed
        && once.observation.effects != Effects::Some
        && !flags.interrupted())
    .then(|| error.message.clone())
}

/// What the turn's agent processes used, over its processes (an overload
/// continuation starts another): CPU summed, the largest peak; `cgroup`
/// only when every figure came from a cgroup.
#[derive(Debug, Default)]
struct Used(Option<crate::process::supervisor::Usage>);

impl Used {
    fn add(&mut self, more: Option<crate::process::supervisor::Usage>) {
        use crate::process::supervisor::{Usage, UsageSource};
        let Some(more) = more else { return };
        self.0 = Some(match self.0 {
            None => more,
            Some(had) => Usage {
                cpu: had.cpu + more.cpu,
                peak_rss_bytes: had.peak_rss_bytes.max(more.peak_rss_bytes),
                source: if had.source == more.source {
                    had.source
                } else {
                    UsageSource::Rusage
                },
            },
        });
    }

    fn reported(&self) -> Option<crate::wire::Resources> {
        use crate::process::supervisor::UsageSource;
        self.0.map(|u| crate::wire::Resources {
            cpu_seconds: u.cpu.as_secs_f64(),
            peak_rss_bytes: u.peak_rss_bytes,
            source: match u.source {
                UsageSource::Cgroup => crate::wire::ResourceSource::Cgroup,
                UsageSource::Rusage => crate::wire::ResourceSource::Rusage,
            },
        })
    }
}

/// What the runner itself did during the turn.
#[derive(Debug, Default)]
struct Flags {
    interrupt_requested: bool,
    stopped_by: Option<Stop>,
}

impl Flags {
    fn interrupted(&self) -> bool {
        self.interrupt_requested || self.stopped_by.is_some()
    }
}

fn finish(
    input: &DriveInput,
    mut outcome: TurnOutcome,
    usage: &Usage,
    used: &Used,
    flags: &Flags,
) -> Driven {
    if flags.interrupted() {
        outcome = TurnOutcome {
            usage: None,
            agent_session_id: None,
            ..TurnOutcome::interrupted()
        };
    }
    let resume_failed = outcome
        .error
        .as_ref()
        .is_some_and(|e| e.code == ErrorCode::ResumeFailed);
    outcome.agent_session_id = if resume_failed {
        // The id leads nowhere; the next turn (or sandbox) starts afresh.
        None
    } else {
        input.session.resume_id()
    };
    outcome.usage = usage.reported();
    outcome.resources = used.reported();
    Driven {
        outcome,
        stopped_by: flags.stopped_by,
    }
}

/// Waits `delay` unless an interrupt or a stop comes first (then false).
async fn wait_unless_stopped(
    delay: Duration,
    requests: &mut mpsc::UnboundedReceiver<RunRequest>,
    stop: &mut watch::Receiver<Stop>,
    flags: &mut Flags,
) -> bool {
    let interrupt = async {
        match requests.recv().await {
            Some(RunRequest::Interrupt) => {}
            // No requester left: only the delay or a stop ends the wait.
            None => std::future::pending().await,
        }
    };
    let waited = async {
        tokio::select! {
            _ = tokio::time::sleep(delay) => true,
            () = interrupt => false,
        }
    };
    match crate::signals::unless_stopped(stop, waited).await {
        Ok(true) => true,
        Ok(false) => {
            flags.interrupt_requested = true;
            false
        }
        Err(s) => {
            flags.stopped_by = Some(s);
            false
        }
    }
}

/// One agent process.
struct Once {
    observation: Observation,
    exit: Exit,
    exit_rule: ExitRule,
    hung: Option<Duration>,
    abort: Option<AgentError>,
    stderr_tail: String,
}

/// Keeps the last few KiB of the agent's stderr (for `agent_crashed`).
#[derive(Default)]
struct Tail(String);

impl Tail {
    const MAX: usize = 4096;

    fn push(&mut self, text: &str) {
        self.0.push_str(text);
        self.0.push('\n');
        if self.0.len() > 2 * Self::MAX {
            let cut = self.0.len() - crate::text::last_bytes(&self.0, Self::MAX).len();
            self.0.drain(..cut);
        }
    }
}

fn record_session(input: &DriveInput, requested: Option<&str>, id: String) {
    // Carried in every later turn's environment (`ORIZU_AGENT_SESSION_ID`)
    // and arguments: an id no CLI makes (over 512 bytes, control
    // characters) would fail every later turn's spawn (found by a review:
    // 200,000 characters, "Argument list too long").
    if id.is_empty() || id.len() > MAX_SESSION_ID || id.chars().any(char::is_control) {
        tracing::warn!(
            bytes = id.len(),
            "the agent reported a session id no CLI makes (empty, over 512 bytes, or with control characters); not carried"
        );
        return;
    }
    let previous = input.session.set_resume_id(id.clone());
    if let Some(asked) = requested
        && asked != id
    {
        tracing::warn!(
            requested = asked,
            reported = %id,
            "the agent reported another session than the one it was asked to resume; carrying the new one"
        );
    } else if previous.as_deref() != Some(id.as_str()) {
        tracing::info!(agent_session_id = %id, "agent session");
    }
    input.events.emit(
        RunnerEvent::AgentSession,
        json!({
            "agentSessionId": id,
            "requested": requested,
            "resumed": requested == Some(id.as_str()),
        }),
    );
}

/// The longest agent session id carried to the next turn.
const MAX_SESSION_ID: usize = 512;

fn runner_is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// The agent's environment for one process of `config`.
/// The environment the agent CLI gets, without a turn's own variables:
/// for what runs the CLI or finds its files outside a turn (the version
/// probe, the agent state of PROTOCOL.md 2.7). The agent user's `HOME`
/// included.
pub fn cli_env(
    config: &AgentConfig,
    base: &[(OsString, OsString)],
    session: &AgentSession,
) -> Vec<(OsString, OsString)> {
    agent_env(config, base, session, None, &[])
}

fn agent_env(
    config: &AgentConfig,
    base: &[(OsString, OsString)],
    session: &AgentSession,
    resume: Option<&str>,
    launch_env: &[(String, crate::secret::Secret)],
) -> Vec<(OsString, OsString)> {
    let mut env: BTreeMap<OsString, OsString> = base.iter().cloned().collect();
    if let Some(user) = &config.user {
        // The runner's HOME is root's; `--agent-env HOME=…` still wins
        // (applied last, by `for_agent`).
        env.insert("HOME".into(), user.home.clone().into_os_string());
        env.insert("USER".into(), user.name.clone().into());
        env.insert("LOGNAME".into(), user.name.clone().into());
    }
    let placeholder = env::for_agent(
        config.kind,
        &mut env,
        &config.env,
        session.model.as_deref(),
        runner_is_root() && config.user.is_none(),
    );
    if let Some(var) = placeholder {
        tracing::info!(
            variable = var,
            "no provider key for the agent; set the documented placeholder (an egress proxy injects the real one)"
        );
    }
    for (k, v) in launch_env {
        let value = match env.get(std::ffi::OsStr::new(k)) {
            // The image's opencode settings stay: ours are merged in.
            Some(image) if k == super::opencode_run::CONFIG_CONTENT_VAR => {
                super::opencode_run::merge_config_content(&image.to_string_lossy(), v.expose())
            }
            _ => v.expose().to_string(),
        };
        env.insert(k.into(), value.into());
    }
    match resume {
        Some(id) => env.insert("ORIZU_AGENT_SESSION_ID".into(), id.into()),
        None => env.remove(std::ffi::OsStr::new("ORIZU_AGENT_SESSION_ID")),
    };
    env.into_iter().collect()
}

/// One agent process: its adapter, the process under the supervisor and
/// the watchdog over both, until the process has exited and the adapter
/// has returned what it saw.
async fn run_once(
    input: &DriveInput,
    prompt: String,
    resume: Option<String>,
    requests: &mut mpsc::UnboundedReceiver<RunRequest>,
    stop: &mut watch::Receiver<Stop>,
    flags: &mut Flags,
) -> Result<Once, SpawnError> {
    let process = input.process();
    let spec = turn_spec(process, input.instructions.clone(), prompt, resume.clone());
    let fresh = || adapter_for(&input.config, spec.clone(), &input.session, &input.redactor);
    let env_of = |launch: &Launch| {
        agent_env(
            &input.config,
            &input.env,
            &input.session,
            resume.as_deref(),
            &launch.env,
        )
    };
    let prestarted = crate::concurrency::lock(&input.prestarted).take();
    if let Some(p) = prestarted {
        // The adapter takes the process's own values (the opencode
        // server's password) only to compare and to use that process: a
        // cold start after a discard gets values of its own.
        let mut adapter = fresh();
        adapter.adopt(&p.prepared.launch);
        let launch = adapter.launch();
        let env = env_of(&launch);
        if let Some(prepared) = take_prestarted(Some(p), &launch, &env, resume.as_deref()).await {
            return Ok(attach(input, prepared, adapter, requests, stop, flags).await);
        }
    }
    let adapter = fresh();
    let launch = adapter.launch();
    let env = env_of(&launch);
    let prepared = prepare(process, env, launch, resume).await?;
    Ok(attach(input, prepared, adapter, requests, stop, flags).await)
}

/// An agent process started, its output flowing into channels that nothing
/// reads yet: the adapter, the watchdog and the supervision of its exit
/// come with [`attach`]. [`run_once`] attaches at once; a process started
/// ahead of its turn waits here ([`Prestarted`]), its output's receiver
/// `L` lent to the adapter's warm-up until the turn ([`Warming`]).
struct Prepared<L = LineReceiver> {
    /// The adapter's end of the process's output.
    lines: L,
    launch: Launch,
    resume: Option<String>,
    started: supervisor::Started,
    supervision: supervisor::Supervision,
    /// The adapter's ends of its channels.
    adapter_io: Channels,
    /// The watchdog's and the process's ends.
    commands: mpsc::UnboundedSender<AdapterCommand>,
    notes: mpsc::UnboundedReceiver<Note>,
    control_tx: mpsc::UnboundedSender<supervisor::Control>,
    control_rx: mpsc::UnboundedReceiver<supervisor::Control>,
    /// Reset by every output line; the watchdog's idle clock.
    last_output: Arc<Mutex<Instant>>,
    tail: Arc<Mutex<Tail>>,
}

/// The adapter's other ends of the channels [`prepare`] makes.
struct Channels {
    stdin: Option<mpsc::UnboundedSender<Vec<u8>>>,
    commands: mpsc::UnboundedReceiver<AdapterCommand>,
    notes: mpsc::UnboundedSender<Note>,
}

/// Starts the process `launch` describes with the environment `env` (the
/// agent's, [`agent_env`]) under the supervisor, its output redacted into
/// the adapter's line channel (bounded: until an adapter reads, the agent's
/// writes wait).
///
/// Errors: the process could not be started.
async fn prepare(
    process: AgentProcess<'_>,
    env: Vec<(OsString, OsString)>,
    launch: Launch,
    resume: Option<String>,
) -> Result<Prepared, SpawnError> {
    // Bounded: an adapter that falls behind slows the reader, not memory.
    let (line_tx, line_rx) = mpsc::channel::<(Stream, Vec<Line>)>(LINE_QUEUE);
    let (stdin_tx, stdin_rx) = match launch.stdin {
        StdinMode::Channel => {
            let (tx, rx) = mpsc::unbounded_channel();
            (Some(tx), Some(rx))
        }
        StdinMode::Bytes(_) => (None, None),
    };
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
    let (note_tx, note_rx) = mpsc::unbounded_channel();
    let (control_tx, control_rx) = mpsc::unbounded_channel();
    let last_output = Arc::new(Mutex::new(Instant::now()));
    let tail = Arc::new(Mutex::new(Tail::default()));
    let observe = observer(last_output.clone(), tail.clone());
    let spawn = spawn_spec(process, &launch, env, stdin_rx);
    // Bytes are redacted as a stream before lines are cut (a secret split
    // across reads or across the 1 MiB cut is still found), then the lines
    // go to the adapter, whose events are redacted again as values (unless
    // the stream's redaction of the line is final, see
    // `Redactor::stream_output_is_final`).
    // The factory owns the callback: when the supervisor returns, every
    // sender of the adapter's lines is gone and the adapter sees the end.
    let redactor = process.redactor.clone();
    let output =
        move |stream| ChannelSink::new(stream, &redactor, observe.clone(), line_tx.clone());
    let supervision = supervisor::Supervision {
        stop_signal: launch.stop_signal,
        ..process.supervision.clone()
    };
    let started = supervisor::start(spawn, &supervision, output).await?;
    Ok(Prepared {
        lines: LineReceiver::new(line_rx),
        launch,
        resume,
        started,
        supervision,
        adapter_io: Channels {
            stdin: stdin_tx,
            commands: cmd_rx,
            notes: note_tx,
        },
        commands: cmd_tx,
        notes: note_rx,
        control_tx,
        control_rx,
        last_output,
        tail,
    })
}

/// Gives the prepared process its adapter (which sends the prompt) and its
/// watchdog (the idle clock from now), supervises it (the time cap from
/// now) and relays requests, stops, notes and alarms until it has exited
/// and the adapter has returned what it saw.
async fn attach(
    input: &DriveInput,
    prepared: Prepared,
    adapter: Box<dyn Adapter>,
    requests: &mut mpsc::UnboundedReceiver<RunRequest>,
    stop: &mut watch::Receiver<Stop>,
    flags: &mut Flags,
) -> Once {
    let Prepared {
        lines,
        launch,
        resume,
        started,
        supervision,
        adapter_io,
        commands,
        notes,
        control_tx,
        control_rx,
        last_output,
        tail,
    } = prepared;
    let io = AdapterIo {
        lines,
        stdin: adapter_io.stdin,
        commands: adapter_io.commands,
        notes: adapter_io.notes,
        events: input.events.clone(),
    };
    let task = tokio::spawn(adapter.run(io));
    let watchdog = Watchdog::new(
        &launch,
        &input.config.timings,
        &input.timings,
        commands,
        control_tx,
    )
    .with_output_clock(last_output)
    .with_wrap_up(wrap_up_at(&input.config, &launch, &supervision));
    let supervised = started.supervise(control_rx, &supervision);
    let mut process = Process {
        input,
        resume: resume.as_deref(),
        watchdog,
        notes,
        abort: None,
        flags,
        interrupt_at: None,
        interrupt_span: None,
    };
    let exit = process.watch(supervised, requests, stop).await;
    // The supervisor returned: its line callbacks are dropped, so the
    // adapter sees the end of the output and returns.
    let observation = collect(task, input.timings.pipe_drain + Duration::from_secs(1)).await;
    let stderr_tail = std::mem::take(&mut crate::concurrency::lock(&tail).0);
    process.finish(exit, observation, launch.exit_rule, stderr_tail)
}

/// When this process gets the wrap-up ([`super::WrapUp`]): its `before`
/// ahead of the time cap, which counts from now, when its CLI takes a
/// message mid-turn; none without a time cap, or with one no longer than
/// `before`.
fn wrap_up_at(
    config: &AgentConfig,
    launch: &Launch,
    supervision: &supervisor::Supervision,
) -> Option<Instant> {
    let wrap_up = config.wrap_up.as_ref().filter(|_| launch.wrap_up)?;
    let lead = supervision.time_cap?.checked_sub(wrap_up.before)?;
    (!lead.is_zero()).then(|| Instant::now() + lead)
}

/// The variables only a turn knows (PROTOCOL.md 3): absent from a
/// pre-started agent's environment (it reads them from the turn file), so
/// left out when its launch is compared with the turn's.
const PER_TURN_VARS: &[&str] = &[
    "ORIZU_TASK_FILE",
    "ORIZU_RUN_ID",
    "ORIZU_TURN_DEADLINE",
    super::INSTRUCTIONS_FILE_VAR,
    crate::telemetry::TRACEPARENT_VAR,
    crate::telemetry::TRACESTATE_VAR,
];

/// An agent CLI started before its turn (issue 38): the process is up, its
/// output waits in its channel, and nothing has been sent to it. The turn
/// that finds it compatible attaches to it ([`DriveInput::prestarted`]);
/// anything else discards it.
pub struct Prestarted {
    prepared: Prepared<Warming>,
    /// Its environment without [`PER_TURN_VARS`] (its arguments and the
    /// session it resumes are the prepared process's).
    env: Vec<(OsString, OsString)>,
}

impl Prestarted {
    /// The leader's pid (its process group and session).
    pub fn pid(&self) -> i32 {
        self.prepared.started.pid()
    }

    /// Whether its leader still runs.
    pub fn running(&self) -> bool {
        self.prepared.started.running()
    }

    /// Kills it and every process of its tree.
    pub async fn discard(self, why: &str) {
        tracing::info!(pgid = self.pid(), why, "pre-started agent discarded");
        let Prepared {
            lines,
            started,
            supervision,
            ..
        } = self.prepared;
        // Dropped, not only aborted: the receiver it holds must go now, or
        // the output's readers wait out the drain bound.
        lines.task.abort();
        drop(lines);
        started.discard(&supervision).await;
    }
}

/// A pre-started process's output, lent to its adapter's warm-up
/// ([`super::Adapter::warm_up`]) until its turn takes it back.
struct Warming {
    task: tokio::task::JoinHandle<LineReceiver>,
    done: tokio::sync::oneshot::Sender<()>,
}

impl<L> Prepared<L> {
    /// The same process with `lines` as its output's receiver, and the
    /// receiver it had.
    fn replace_lines<M>(self, lines: M) -> (L, Prepared<M>) {
        let prepared = Prepared {
            lines,
            launch: self.launch,
            resume: self.resume,
            started: self.started,
            supervision: self.supervision,
            adapter_io: self.adapter_io,
            commands: self.commands,
            notes: self.notes,
            control_tx: self.control_tx,
            control_rx: self.control_rx,
            last_output: self.last_output,
            tail: self.tail,
        };
        (self.lines, prepared)
    }
}

impl Prepared {
    /// Lends the output to `adapter`'s warm-up while the process waits.
    fn warm_up(self, adapter: &dyn super::Adapter) -> Prepared<Warming> {
        let (lines, prepared) = self.replace_lines(());
        let (done, done_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(adapter.warm_up(lines, done_rx));
        prepared.replace_lines(Warming { task, done }).1
    }
}

impl Prepared<Warming> {
    /// The process with its output back from the warm-up (which stops now);
    /// `None`, with the process killed, if the warm-up failed.
    async fn ready(self) -> Option<Prepared> {
        let (Warming { task, done }, prepared) = self.replace_lines(());
        let _ = done.send(());
        match task.await {
            Ok(lines) => Some(prepared.replace_lines(lines).1),
            Err(e) => {
                tracing::warn!(error = %e, "the pre-started agent's warm-up failed; discarding it");
                prepared.started.discard(&prepared.supervision).await;
                None
            }
        }
    }
}

/// Whether the adapter of `kind` can be started before its prompt: its CLI
/// waits for what the runner sends at the turn's start (Claude Code's
/// stream-json input, Codex app-server's and an ACP agent's JSON-RPC on
/// stdin, opencode serve's HTTP API), and sends the model provider nothing
/// before it (real-CLI tests; for ACP, Claude Code's agent).
pub fn prestartable(kind: AgentKind) -> bool {
    matches!(
        kind,
        AgentKind::Claude | AgentKind::Codex | AgentKind::OpenCode | AgentKind::Acp
    )
}

/// Starts the next turn's agent now, with `env` (the agent's environment
/// with the boot-wide per-turn paths: the bearer file's and the turn
/// file's) and the session to resume as it stands. `None` when the spawn
/// failed (the turn then starts cold and reports it).
pub async fn prestart(
    process: AgentProcess<'_>,
    env: &[(OsString, OsString)],
    instructions: Option<super::Instructions>,
) -> Option<Prestarted> {
    let resume = process.session.resume_id();
    let spec = turn_spec(process, instructions, String::new(), resume.clone());
    let adapter = adapter_for(process.config, spec, process.session, process.redactor);
    let launch = adapter.launch();
    // Without the per-turn variables, even those the runner's own
    // environment gave (a compatible `ORIZU_RUN_ID`): the turn file has
    // them.
    let env = without_per_turn_vars(&agent_env(
        process.config,
        env,
        process.session,
        resume.as_deref(),
        &launch.env,
    ));
    let compared = env.clone();
    match prepare(process, env, launch, resume).await {
        Ok(prepared) => {
            tracing::info!(
                pgid = prepared.started.pid(),
                "agent pre-started for the next turn"
            );
            Some(Prestarted {
                prepared: prepared.warm_up(adapter.as_ref()),
                env: compared,
            })
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot pre-start the agent; the next turn starts it");
            None
        }
    }
}

/// `env` without [`PER_TURN_VARS`].
fn without_per_turn_vars(env: &[(OsString, OsString)]) -> Vec<(OsString, OsString)> {
    env.iter()
        .filter(|(k, _)| !PER_TURN_VARS.iter().any(|v| k == *v))
        .cloned()
        .collect()
}

/// The pre-started agent when this attempt can use it: still running,
/// started as this attempt's process would be (`launch` with `env`,
/// resuming `resume`). Otherwise it is discarded, saying why.
async fn take_prestarted(
    prestarted: Option<Prestarted>,
    launch: &Launch,
    env: &[(OsString, OsString)],
    resume: Option<&str>,
) -> Option<Prepared> {
    let p = prestarted?;
    let why = if !p.prepared.started.running() {
        "it exited before its turn"
    } else if p.prepared.resume.as_deref() != resume {
        "the session to resume changed"
    } else if p.prepared.launch.args != launch.args {
        "the turn's arguments differ (model, effort, instructions)"
    } else if p.env != without_per_turn_vars(env) {
        "the turn's environment differs"
    } else {
        tracing::info!(pgid = p.pid(), "the turn uses the pre-started agent");
        return p.prepared.ready().await;
    };
    p.discard(why).await;
    None
}

/// What the adapter needs to know about this process's part of the turn.
fn turn_spec(
    process: AgentProcess<'_>,
    instructions: Option<super::Instructions>,
    prompt: String,
    resume: Option<String>,
) -> TurnSpec {
    let config = process.config;
    TurnSpec {
        prompt,
        cwd: process.cwd.to_path_buf(),
        resume,
        model: process.session.model.clone(),
        effort: process.session.effort.clone(),
        extra_args: match config.kind {
            AgentKind::Command => [config.args.clone(), config.extra_args.clone()].concat(),
            _ => config.extra_args.clone(),
        },
        opencode_port: config.opencode_port,
        timings: config.timings,
        instructions,
        wrap_up: config.wrap_up.as_ref().map(|w| w.message.clone()),
        acp_permissions: config.acp_permissions,
    }
}

/// The process to start: for a CLI, the words of `--agent-command` (a
/// launcher) before the adapter's arguments; `command`'s are in the
/// adapter's already.
fn spawn_spec(
    process: AgentProcess<'_>,
    launch: &Launch,
    env: Vec<(OsString, OsString)>,
    stdin_feed: Option<mpsc::UnboundedReceiver<Vec<u8>>>,
) -> SpawnSpec {
    let config = process.config;
    let args = match config.kind {
        AgentKind::Command => launch.args.clone(),
        _ => [config.args.clone(), launch.args.clone()].concat(),
    };
    SpawnSpec {
        program: config.program.clone(),
        args,
        cwd: process.cwd.to_path_buf(),
        env,
        stdin: match &launch.stdin {
            StdinMode::Bytes(b) => b.clone(),
            StdinMode::Channel => Vec::new(),
        },
        stdin_feed,
        user: config.user.clone(),
    }
}

/// The callback every output line passes: it resets the idle clock, and a
/// stderr line goes to the tail kept for `agent_crashed`.
fn observer(
    last_output: Arc<Mutex<Instant>>,
    tail: Arc<Mutex<Tail>>,
) -> impl Fn(Stream, &Line) + Clone + Send + 'static {
    move |stream: Stream, line: &Line| {
        *crate::concurrency::lock(&last_output) = Instant::now();
        crate::telemetry::metrics::agent_output();
        if stream == Stream::Stderr {
            crate::concurrency::lock(&tail).push(&line.text());
        }
    }
}

/// What the adapter saw. Its output has ended, so it returns; should it
/// not within `bound`, the turn goes on without its observation.
async fn collect(task: tokio::task::JoinHandle<Observation>, bound: Duration) -> Observation {
    match tokio::time::timeout(bound, task).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => {
            tracing::error!(error = %e, "the agent's adapter failed");
            Observation::default()
        }
        Err(_) => {
            tracing::error!("the agent's adapter did not finish after the agent exited");
            Observation::default()
        }
    }
}

/// The runner's side of one running agent process: what the arms of
/// [`Process::watch`] act on.
struct Process<'a> {
    input: &'a DriveInput,
    /// The agent session this process was asked to resume.
    resume: Option<&'a str>,
    watchdog: Watchdog,
    notes: mpsc::UnboundedReceiver<Note>,
    /// The adapter's reason to give up, first one kept.
    abort: Option<AgentError>,
    flags: &'a mut Flags,
    /// When the first interrupt or stop was requested.
    interrupt_at: Option<Instant>,
    /// The interrupt's span (issue 40): from the first interrupt or stop
    /// to the agent's end, with how it stopped.
    interrupt_span: Option<tracing::Span>,
}

impl Process<'_> {
    /// Hands the turn's requests, the stop signals, the adapter's notes and
    /// the watchdog's alarms to their handlers until the supervisor returns.
    async fn watch(
        &mut self,
        supervised: impl Future<Output = Exit>,
        requests: &mut mpsc::UnboundedReceiver<RunRequest>,
        stop: &mut watch::Receiver<Stop>,
    ) -> Exit {
        tokio::pin!(supervised);
        let (mut requests_open, mut stop_open, mut notes_open) = (true, true, true);
        // An interrupt or stop that came before this process (a continuation).
        if self.flags.interrupted() {
            self.watchdog.interrupt();
        }
        loop {
            let alarm = self.watchdog.next();
            tokio::select! {
                r = &mut supervised => return r,
                r = requests.recv(), if requests_open => match r {
                    Some(request) => self.on_request(request),
                    None => requests_open = false,
                },
                changed = stop.changed(), if stop_open => match changed {
                    Ok(()) => {
                        let s = *stop.borrow_and_update();
                        self.on_stop(s);
                    }
                    Err(_) => stop_open = false,
                },
                note = self.notes.recv(), if notes_open => match note {
                    Some(note) => self.on_note(note),
                    None => notes_open = false,
                },
                _ = crate::concurrency::sleep_until(alarm.map(|(at, _)| at)) => {
                    if let Some((_, alarm)) = alarm {
                        self.watchdog.ring(alarm);
                    }
                }
            }
        }
    }

    fn on_request(&mut self, request: RunRequest) {
        match request {
            RunRequest::Interrupt => {
                self.flags.interrupt_requested = true;
                self.interrupt_at.get_or_insert_with(Instant::now);
                self.interrupt_span("interrupt");
                tracing::info!("interrupt requested; asking the agent to stop");
                self.watchdog.interrupt();
            }
        }
    }

    /// Opens the interrupt's span, once.
    fn interrupt_span(&mut self, why: &'static str) {
        self.interrupt_span.get_or_insert_with(|| {
            tracing::info_span!("interrupt", why, stopped_by = tracing::field::Empty)
        });
    }

    fn on_stop(&mut self, stop: Stop) {
        if stop != Stop::Running {
            self.interrupt_at.get_or_insert_with(Instant::now);
            self.interrupt_span("stop");
        }
        match stop {
            Stop::Graceful(_) => {
                self.flags.stopped_by = Some(stop);
                self.watchdog.stop();
            }
            Stop::Immediate(_) => {
                self.flags.stopped_by = Some(stop);
                self.watchdog.kill();
            }
            Stop::Running => {}
        }
    }

    fn on_note(&mut self, note: Note) {
        match note {
            Note::SessionId(id) => record_session(self.input, self.resume, id),
            Note::Terminal => self.watchdog.terminal(),
            Note::TerminalStopNow => {
                self.watchdog.terminal();
                self.watchdog.stop_tree();
            }
            Note::WrapUpSent => {
                let before = self.input.config.wrap_up.as_ref().map(|w| w.before);
                let before_ms = before.map(|b| u64::try_from(b.as_millis()).unwrap_or(u64::MAX));
                self.input
                    .events
                    .emit(RunnerEvent::WrapUp, json!({"beforeMs": before_ms}));
            }
            Note::Activity => self.watchdog.activity(),
            Note::Abort(e) => {
                if self.abort.is_none() && !self.flags.interrupted() {
                    tracing::warn!(
                        code = e.code.as_str(),
                        "giving up on the turn: {}",
                        e.message
                    );
                    self.abort = Some(e);
                    self.watchdog.interrupt();
                }
            }
        }
    }

    /// The process has exited and the adapter returned: the notes still
    /// queued count, and the time cap decides over the idle watchdog.
    fn finish(
        mut self,
        exit: Exit,
        observation: Observation,
        exit_rule: ExitRule,
        stderr_tail: String,
    ) -> Once {
        if let Some(at) = self.interrupt_at {
            let how = if exit.killed {
                "SIGKILL to its process group (still running at the end of the grace period)"
            } else if exit.signalled {
                "SIGINT to its process group"
            } else if self.watchdog.protocol_sent() {
                "the CLI's protocol interrupt"
            } else {
                "exiting by itself"
            };
            if let Some(span) = self.interrupt_span.take() {
                span.record("stopped_by", how);
            }
            tracing::info!(
                stopped_by = how,
                latency_ms = u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX),
                "the agent stopped after the interrupt: {how}"
            );
        }
        while let Ok(note) = self.notes.try_recv() {
            match note {
                Note::SessionId(id) => record_session(self.input, self.resume, id),
                Note::Abort(e) if self.abort.is_none() && !self.flags.interrupted() => {
                    self.abort = Some(e);
                }
                _ => {}
            }
        }
        let mut hung = self.watchdog.hung();
        // The supervisor stopped the agent at the turn's time cap; an
        // interrupt or stop that came during the cap's grace wins
        // (PROTOCOL.md 4.1 step 4).
        if exit.timed_out && !self.flags.interrupted() {
            hung = None;
            self.abort = Some(AgentError::new(
                ErrorCode::AgentTimeout,
                self.input.supervision.timeout_message(),
            ));
        }
        Once {
            observation,
            exit,
            exit_rule,
            hung,
            abort: self.abort,
            stderr_tail,
        }
    }
}

/// The `runner_error` message of a turn whose guard died before it ended
/// (PROTOCOL.md 4.1 step 4).
pub fn guard_died_message(guard_pid: i32) -> String {
    format!(
        "the turn guard (pid {guard_pid}) died before the turn ended (an agent may have killed it); the runner killed every process of the turn, which would otherwise not die with the runner"
    )
}

/// The outcome of one agent process: the runner's own evidence first
/// (interrupt, stop, watchdog, a give-up), then the terminal event, then
/// what the adapter saw, then the stderr text, then the exit status.
fn outcome_of(config: &AgentConfig, once: &Once, flags: &Flags, resuming: bool) -> TurnOutcome {
    if let Some(guard) = once.exit.guard_died {
        return TurnOutcome::failed(ErrorCode::RunnerError, guard_died_message(guard));
    }
    if flags.interrupted() {
        return TurnOutcome::interrupted();
    }
    if let Some(idle) = once.hung {
        return TurnOutcome::failed(
            ErrorCode::AgentHung,
            format!(
                "the agent produced no output for {}; the runner interrupted it",
                humantime::format_duration(Duration::from_secs(idle.as_secs().max(1)))
            ),
        );
    }
    if let Some(e) = &once.abort {
        return TurnOutcome::failed_with(e.clone());
    }
    match &once.observation.terminal {
        Some(Terminal::Completed) => return TurnOutcome::succeeded(),
        Some(Terminal::Failed(e)) => return TurnOutcome::failed_with(e.clone()),
        Some(Terminal::Aborted) => {
            return TurnOutcome::failed(
                ErrorCode::AgentCrashed,
                "the agent reported its turn aborted, but the runner did not interrupt it",
            );
        }
        None => {}
    }
    let success = once.exit.status.is_some_and(|s| s.success());
    match once.exit_rule {
        ExitRule::Command => return command::outcome(&once.exit),
        ExitRule::ZeroSucceeds if success && once.observation.failure.is_none() => {
            return TurnOutcome::succeeded();
        }
        _ => {}
    }
    if let Some(e) = &once.observation.failure {
        return TurnOutcome::failed_with(e.clone());
    }
    let how = match once.exit.status {
        Some(s) => command::describe_status(s),
        None => "ended".to_string(),
    };
    let tail = crate::text::clip_start(once.stderr_tail.trim(), 400);
    let message = if tail.is_empty() {
        format!("{} {how} without a terminal event", config.program)
    } else {
        format!(
            "{} {how} without a terminal event; stderr: {tail}",
            config.program
        )
    };
    let code = classify::from_text(&once.stderr_tail, resuming).unwrap_or(ErrorCode::AgentCrashed);
    TurnOutcome::failed(code, message)
}

/// Starts `<program> --version` in the background, once per boot, as soon
/// as the workspace is ready: the first run's `hosted_boot.runner` event
/// ([`emit_runner_event`]) takes its answer when it comes, and the agent
/// never waits for it (`--version` takes seconds on a loaded machine:
/// opencode's ~0.6 s idle, several seconds under load).
pub fn start_version_probe(
    config: &AgentConfig,
    session: &std::sync::Arc<AgentSession>,
    base_env: &[(OsString, OsString)],
    cwd: &std::path::Path,
) {
    // An ACP agent names its version in `initialize`; `--version` may
    // start it as a server.
    if matches!(config.kind, AgentKind::Command | AgentKind::Acp) {
        return;
    }
    let env = cli_env(config, base_env, session);
    let (config, session, cwd) = (config.clone(), session.clone(), cwd.to_path_buf());
    tokio::spawn(async move {
        session.version(cli_version(&config, env, &cwd)).await;
    });
}

/// The run's `hosted_boot.runner` event (PROTOCOL.md 4.6), emitted by
/// [`emit_runner_event`]: at once when the CLI's version is known (every
/// run but, at most, the boot's first), else from a task of its own as
/// soon as the probe answers, so the agent never waits for `--version`.
pub struct RunnerEventTask(Option<tokio::task::JoinHandle<()>>);

impl RunnerEventTask {
    /// Waits until the event is emitted (the probe is bounded by
    /// [`super::AgentTimings::version_timeout`] from its start at boot)
    /// unless a stop comes first: then the event is dropped, logged, so the
    /// stop's bounds (4.4) hold. Its sender goes with it, so the run's
    /// flush is not held open by it.
    pub async fn settled(mut self, mut stop: watch::Receiver<Stop>) {
        let Some(task) = self.0.take() else { return };
        let abort = task.abort_handle();
        if crate::signals::unless_stopped(&mut stop, task)
            .await
            .is_err()
        {
            abort.abort();
            tracing::warn!(
                "the agent CLI had not answered --version when the stop came; this run has no hosted_boot.runner event"
            );
        }
    }
}

impl Drop for RunnerEventTask {
    /// A turn that ends without [`RunnerEventTask::settled`] (a panic)
    /// leaves no task holding its event sender.
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// Emits the `hosted_boot.runner` event that every run carries:
/// `runnerVersion`, `agent`, `program` and, for the known CLIs,
/// `cliVersion` (the first line `<program> --version` prints, or null).
/// The probe was started at boot ([`start_version_probe`]); when it has not
/// answered yet, the event follows from a task once it does, and the
/// returned handle says when.
pub fn emit_runner_event(
    config: &AgentConfig,
    session: &Arc<AgentSession>,
    base_env: &[(OsString, OsString)],
    cwd: &std::path::Path,
    events: &EventSender,
) -> RunnerEventTask {
    let mut data = json!({
        "runnerVersion": env!("CARGO_PKG_VERSION"),
        "agent": config.name(),
        "program": config.program,
    });
    if matches!(config.kind, AgentKind::Command | AgentKind::Acp) {
        events.emit(RunnerEvent::Runner, data);
        return RunnerEventTask(None);
    }
    if let Some(version) = session.known_version() {
        data["cliVersion"] = json!(version);
        events.emit(RunnerEvent::Runner, data);
        return RunnerEventTask(None);
    }
    tracing::info!(
        program = %config.program,
        "the agent CLI has not answered --version yet; the agent starts without it and the run's hosted_boot.runner event follows its answer"
    );
    let env = agent_env(config, base_env, session, None, &[]);
    let (config, session, cwd) = (config.clone(), session.clone(), cwd.to_path_buf());
    let events = events.clone();
    RunnerEventTask(Some(tokio::spawn(async move {
        let version = session.version(cli_version(&config, env, &cwd)).await;
        data["cliVersion"] = json!(version);
        events.emit(RunnerEvent::Runner, data);
    })))
}

/// `<program> --version`'s first line (at most 200 characters), bounded.
/// Run as the agent user when there is one (it is the agent's program).
async fn cli_version(
    config: &AgentConfig,
    env: Vec<(OsString, OsString)>,
    cwd: &std::path::Path,
) -> Option<String> {
    let (program, bound) = (config.program.as_str(), config.timings.version_timeout);
    let mut cmd = tokio::process::Command::new(program);
    if let Some(user) = &config.user {
        user.apply(&mut cmd);
    }
    cmd.args(&config.args)
        .arg("--version")
        .current_dir(cwd)
        .env_clear()
        .envs(env)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = match tokio::time::timeout(bound, cmd.output()).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => {
            tracing::warn!(program, error = %e, "cannot run the agent CLI for its version");
            return None;
        }
        Err(_) => {
            tracing::warn!(
                program,
                bound = %humantime::format_duration(bound),
                "the agent CLI did not print its version within the bound; cliVersion is null in this boot's hosted_boot.runner events"
            );
            return None;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().map(str::trim).find(|l| !l.is_empty());
    if line.is_none() && std::os::unix::process::ExitStatusExt::signal(&out.status).is_some() {
        // With --agent-user, the end of a turn kills every process of that
        // user: a first turn that ends before `--version` answers ends it.
        tracing::warn!(
            program,
            status = %out.status,
            "the agent CLI was killed before it printed its version (with --agent-user, a first turn that ends first kills it); cliVersion is null in this boot's hosted_boot.runner events"
        );
    }
    Some(crate::text::head(line?, 200).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::RunOutcome;
    use std::os::unix::process::ExitStatusExt;

    fn once(terminal: Option<Terminal>, code: i32, rule: ExitRule, stderr: &str) -> Once {
        Once {
            observation: Observation {
                terminal,
                ..Observation::default()
            },
            exit: Exit {
                status: Some(std::process::ExitStatus::from_raw(code << 8)),
                signalled: false,
                killed: false,
                pgid: 1,
                timed_out: false,
                swept: 0,
                left_behind: Vec::new(),
                guard_died: None,
                usage: None,
            },
            exit_rule: rule,
            hung: None,
            abort: None,
            stderr_tail: stderr.into(),
        }
    }

    fn claude() -> AgentConfig {
        AgentConfig {
            kind: AgentKind::Claude,
            ..AgentConfig::command("claude", vec![])
        }
    }

    #[test]
    fn the_runner_decides_interrupted_whatever_the_agent_says() {
        let flags = Flags {
            interrupt_requested: true,
            stopped_by: None,
        };
        let o = once(Some(Terminal::Completed), 0, ExitRule::NeedsTerminal, "");
        assert_eq!(
            outcome_of(&claude(), &o, &flags, false).status,
            RunOutcome::Interrupted
        );
    }

    #[test]
    fn a_terminal_event_wins_over_the_exit_status() {
        let o = once(Some(Terminal::Completed), 143, ExitRule::NeedsTerminal, "");
        assert_eq!(
            outcome_of(&claude(), &o, &Flags::default(), false).status,
            RunOutcome::Succeeded
        );
    }

    #[test]
    fn no_terminal_event_is_a_crash_with_the_stderr_tail_or_its_class() {
        let o = once(None, 1, ExitRule::NeedsTerminal, "boom\n");
        let v = outcome_of(&claude(), &o, &Flags::default(), false);
        let e = v.error.unwrap();
        assert_eq!(e.code, ErrorCode::AgentCrashed);
        assert!(e.message.contains("exited with status 1") && e.message.contains("boom"));
        let o = once(
            None,
            1,
            ExitRule::NeedsTerminal,
            "Error: No conversation found with session ID: x",
        );
        assert_eq!(
            outcome_of(&claude(), &o, &Flags::default(), true)
                .error
                .unwrap()
                .code,
            ErrorCode::ResumeFailed
        );
        // Exit 0 without a terminal event is no success for such a CLI.
        let o = once(None, 0, ExitRule::NeedsTerminal, "");
        assert_eq!(
            outcome_of(&claude(), &o, &Flags::default(), false).status,
            RunOutcome::Failed
        );
        let o = once(None, 0, ExitRule::ZeroSucceeds, "");
        assert_eq!(
            outcome_of(&claude(), &o, &Flags::default(), false).status,
            RunOutcome::Succeeded
        );
    }

    #[test]
    fn the_stderr_tail_is_bounded() {
        let mut t = Tail::default();
        for _ in 0..10_000 {
            t.push("0123456789");
        }
        assert!(t.0.len() <= 2 * Tail::MAX);
    }
}
