//! Any agent that speaks the Agent Client Protocol (`--agent acp
//! --agent-command CMD`): JSON-RPC 2.0 over the agent's stdin and stdout,
//! one message a line, protocol version 1. One process per turn:
//!
//! ```text
//! → initialize {protocolVersion: 1, clientCapabilities: {fs: {readTextFile: false,
//!     writeTextFile: false}, terminal: false}, clientInfo}      ← {agentCapabilities: {loadSession?}}
//! → session/load {sessionId, cwd, mcpServers: []}  (a session to resume, when the agent loads sessions)
//!   | session/new {cwd, mcpServers: []}            ← {sessionId, modes?}
//! → session/set_mode {sessionId, modeId}           (a mode that runs tools unasked, when offered; allow only)
//! → session/prompt {sessionId, prompt: [{type: "text", text}]}
//! ← session/update … ← session/request_permission (answered: --acp-permissions)
//! ← {stopReason, usage?}                          (interrupt: → session/cancel {sessionId})
//! ```
//!
//! The runner offers no file-system or terminal capability: served by the
//! runner they would run as root, outside the agent user and the turn's
//! process tree; the agent uses its own tools. Permission requests are
//! answered by `--acp-permissions`: by default with the agent's own "allow
//! once" option (its "allow always" only when it offers no other), as the
//! other adapters run their CLIs in bypass mode; with `reject`, its "reject
//! once" (else "reject always"), and a mode that asks set when offered.
//! Each request is an
//! event carrying the runner's answer (`runnerAnswer`). The session id is the
//! agent session id; a `session/load` the agent refuses fails the turn
//! `resume_failed`, which runs it again in a fresh session
//! (`agentSessionReset`). Message and thought chunks are joined into one
//! event per message; the history a `session/load` replays is not this
//! turn's and is not forwarded. Stdin is closed after the prompt's answer;
//! the agent, a server, is then stopped with its tree. A turn that ends
//! `end_turn` after the agent reported a system error (Codex's, which
//! words its provider errors as messages) fails, classified from them.

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

use super::classify;
use super::jsonrpc::{self, Message};
use super::lenient;
use super::{
    AcpPermissions, Adapter, AdapterIo, AgentError, Effects, ExitRule, Launch, Note, Observation,
    StdinMode, Terminal, TurnSpec, Usage,
};
use crate::events::event::AgentEvent;
use crate::wire::ErrorCode;

/// The protocol version the runner speaks (ACP's only stable one).
pub const PROTOCOL_VERSION: u64 = 1;

const INITIALIZE: u64 = 0;
const SESSION: u64 = 1;
/// `session/set_mode` and `session/set_config_option` (model, effort),
/// one at a time before the prompt.
const SETTING: u64 = 2;
const PROMPT: u64 = 3;

/// The most text of a streamed message joined into one event (1 MiB, as an
/// output line is cut).
const MAX_JOINED: usize = 1 << 20;

/// Modes, by id, in which an agent runs its tools without asking: Claude
/// Code's agent (`bypassPermissions`, offered when not root or with
/// `IS_SANDBOX=1`), Codex's (`full-access`, `agent-full-access`), Gemini
/// CLI's (`yolo`). The first one an agent offers is set; otherwise its
/// permission requests are answered as they come.
const UNATTENDED_MODES: &[&str] = &[
    "bypassPermissions",
    "full-access",
    "agent-full-access",
    "yolo",
];

/// Modes, by id, in which an agent asks before it edits or runs a tool,
/// set under `--acp-permissions reject` when offered (the agents' own
/// defaults need not ask: Claude Code's starts in `auto` or `acceptEdits`,
/// which write files unasked): Claude Code's and Gemini CLI's `default`,
/// Codex's `read-only`.
const ASKING_MODES: &[&str] = &["default", "read-only"];

/// The ACP adapter for one process.
pub struct AcpAdapter {
    spec: TurnSpec,
}

impl AcpAdapter {
    /// For one turn.
    pub fn new(spec: TurnSpec) -> Self {
        AcpAdapter { spec }
    }
}

impl Adapter for AcpAdapter {
    fn launch(&self) -> Launch {
        Launch {
            args: self.spec.extra_args.clone(),
            env: Vec::new(),
            stdin: StdinMode::Channel,
            protocol_interrupt: true,
            // ACP agents are servers: some never exit at the end of their
            // input (Codex's), and their tools run in sessions of their own.
            server: true,
            exit_rule: ExitRule::NeedsTerminal,
            stop_signal: rustix::process::Signal::TERM,
            wrap_up: false,
        }
    }

    fn run(self: Box<Self>, io: AdapterIo) -> BoxFuture<'static, Observation> {
        run(self.spec, io).boxed()
    }
}

#[derive(Debug, Default)]
struct State {
    session_id: Option<String>,
    /// `session/load` is answered when this is false: until then the
    /// agent replays the session's history, which is not this turn's.
    loading: bool,
    /// The prompt was sent (an interrupt before it ends the process).
    prompted: bool,
    interrupt_pending: bool,
    effects: Effects,
    terminal: Option<Terminal>,
    failure: Option<AgentError>,
    usage: Usage,
    /// The chunks of the message being streamed: its kind and text.
    chunks: Option<(String, String)>,
    /// Settings still to send before the prompt (method, params).
    settings: Vec<(&'static str, Value)>,
    /// The ids of the runner's requests not answered yet: an answer to any
    /// other id is ignored (a stray one must not repeat or skip a step).
    pending: Vec<u64>,
    /// The agent loads sessions (`agentCapabilities.loadSession`): only then
    /// is its session id carried to the next turn.
    loads: bool,
    /// Codex's agent said its thread hit a system error
    /// (`_meta.codex.threadStatus.type: "systemError"` in a
    /// `session_info_update`): the text of the messages since (the
    /// provider's error, which it sends as a message before ending the
    /// turn `end_turn`, not as an error).
    system_error: Option<String>,
}

/// The most of a system error's text kept for the classifier.
const MAX_SYSTEM_ERROR: usize = 4096;

async fn run(spec: TurnSpec, mut io: AdapterIo) -> Observation {
    let mut state = State {
        usage: Usage {
            model: spec.model.clone(),
            ..Usage::default()
        },
        ..State::default()
    };
    state.pending.push(INITIALIZE);
    io.send_json(&json!({
        "jsonrpc": "2.0",
        "id": INITIALIZE,
        "method": "initialize",
        "params": {
            "protocolVersion": PROTOCOL_VERSION,
            "clientCapabilities": {
                "fs": {"readTextFile": false, "writeTextFile": false},
                "terminal": false,
            },
            "clientInfo": {"name": "hosted-boot", "title": "hosted-boot", "version": env!("CARGO_PKG_VERSION")},
        },
    }));
    jsonrpc::serve(
        &mut io,
        &mut state,
        |state, io, value| handle(&spec, state, io, value),
        interrupt,
    )
    .await;
    flush_chunks(&mut state, &io);
    Observation {
        terminal: state.terminal,
        failure: state.failure,
        usage: state.usage,
        effects: state.effects,
    }
}

fn send(state: &mut State, io: &AdapterIo, id: u64, method: &str, params: Value) {
    state.pending.push(id);
    io.send_json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
}

fn interrupt(state: &mut State, io: &mut AdapterIo) {
    if state.terminal.is_some() {
        return;
    }
    match (&state.session_id, state.prompted) {
        (Some(session), true) => {
            io.send_json(&json!({
                "jsonrpc": "2.0",
                "method": "session/cancel",
                "params": {"sessionId": session},
            }));
        }
        (Some(_), false) if !state.loading => state.interrupt_pending = true,
        // Nothing runs yet: closing stdin ends the agent.
        _ => io.stdin = None,
    }
}

fn handle(spec: &TurnSpec, state: &mut State, io: &mut AdapterIo, value: &Value) {
    let Some(message) = jsonrpc::parse(value) else {
        emit(io, "output", value, value);
        return;
    };
    match message {
        Message::Response { id, result } => response(spec, state, io, id.as_u64(), result),
        Message::Notification { method, params } => {
            notification(state, io, &method, &params, value);
        }
        Message::Request { id, method, params } => {
            request(spec, state, io, &id, &method, &params, value);
        }
    }
}

fn response(
    spec: &TurnSpec,
    state: &mut State,
    io: &mut AdapterIo,
    id: Option<u64>,
    result: Result<Value, Value>,
) {
    let Some(at) = id.and_then(|id| state.pending.iter().position(|p| *p == id)) else {
        tracing::debug!(id = ?id, "an answer to no request of the runner's; ignored");
        return;
    };
    state.pending.remove(at);
    match (id, result) {
        (Some(INITIALIZE), Ok(result)) => {
            let Initialized {
                agent_capabilities: caps,
            } = lenient::read(&result);
            open_session(spec, state, io, caps.load_session.unwrap_or(false));
        }
        (Some(SESSION), Ok(result)) => {
            let opened: Opened = lenient::read(&result);
            state.loading = false;
            if state.session_id.is_none() {
                state.session_id = opened.session_id.clone();
            }
            let Some(session) = state.session_id.clone() else {
                let error =
                    json!({"message": "the agent's answer to session/new has no sessionId"});
                refused(spec, state, io, Some(SESSION), &error);
                return;
            };
            if state.loads {
                io.note(Note::SessionId(session.clone()));
            } else {
                // Never loaded again: carried, it would make the next turn
                // (or an overload continuation, whose prompt names no task)
                // run as if it resumed this one (found by a review).
                tracing::info!(
                    agent_session_id = %session,
                    "the ACP agent does not load sessions: its session id is not carried to the next turn"
                );
            }
            state.settings = settings(spec, &session, &opened);
            next_setting(spec, state, io);
        }
        // A setting refused changes nothing but itself (logged): a mode
        // left as it was has its permission requests answered as they
        // come.
        (Some(SETTING), result) => {
            if let Err(error) = result {
                tracing::warn!(error = %error_text(&error), "the ACP agent refused a setting; the turn goes on without it");
            }
            next_setting(spec, state, io);
        }
        (Some(PROMPT), Ok(result)) => prompt_ended(state, io, &result),
        (which, Err(error)) => refused(spec, state, io, which, &error),
        (_, Ok(_)) => {}
    }
}

/// `initialize` answered: `session/load` of the session to resume when the
/// agent loads sessions, else `session/new`.
fn open_session(spec: &TurnSpec, state: &mut State, io: &AdapterIo, loads: bool) {
    let cwd = spec.cwd.to_string_lossy();
    state.loads = loads;
    match spec.resume.as_deref() {
        Some(session) if loads => {
            state.session_id = Some(session.to_string());
            state.loading = true;
            send(
                state,
                io,
                SESSION,
                "session/load",
                json!({"sessionId": session, "cwd": cwd, "mcpServers": []}),
            );
        }
        resume => {
            if resume.is_some() {
                tracing::info!(
                    "the ACP agent does not load sessions (agentCapabilities.loadSession): the turn runs in a new one"
                );
            }
            send(
                state,
                io,
                SESSION,
                "session/new",
                json!({"cwd": cwd, "mcpServers": []}),
            );
        }
    }
}

/// What to set before the prompt: a mode that runs tools unasked, when
/// the agent offers one and its permissions are granted (rejected, the
/// agent's mode is kept, so that it asks); the turn's model and effort where the agent offers
/// them among the values of its `model` and `thought_level` options (ACP's
/// session configuration; an agent that offers aliases, as Claude Code's
/// does, takes `clientInfo.model` only when it is one of them).
fn settings(spec: &TurnSpec, session: &str, opened: &Opened) -> Vec<(&'static str, Value)> {
    let mut out = Vec::new();
    let offered = opened.modes.available_modes.clone().unwrap_or_default();
    let wanted = match spec.acp_permissions {
        AcpPermissions::Allow => UNATTENDED_MODES,
        AcpPermissions::Reject => ASKING_MODES,
    };
    let current = opened.modes.current_mode_id.as_deref();
    let mode = wanted
        .iter()
        .find(|w| offered.iter().any(|m| m.id.as_deref() == Some(**w)));
    if let Some(mode) = mode.filter(|m| current != Some(**m)) {
        out.push((
            "session/set_mode",
            json!({"sessionId": session, "modeId": mode}),
        ));
    }
    let options = opened.config_options.clone().unwrap_or_default();
    for (category, wanted) in [
        ("model", spec.model.as_deref()),
        ("thought_level", spec.effort.as_deref()),
    ] {
        let Some(wanted) = wanted else { continue };
        let Some(option) = options
            .iter()
            .find(|o| o.category.as_deref() == Some(category))
        else {
            continue;
        };
        let values = option.options.clone().unwrap_or_default();
        if values.iter().any(|v| v.value.as_deref() == Some(wanted)) {
            out.push((
                "session/set_config_option",
                json!({"sessionId": session, "configId": option.id, "value": wanted}),
            ));
        } else {
            tracing::info!(
                category,
                value = wanted,
                "the ACP agent does not offer this value; the turn runs with its own"
            );
        }
    }
    out
}

/// Sends the next setting, or the prompt once none is left.
fn next_setting(spec: &TurnSpec, state: &mut State, io: &mut AdapterIo) {
    if state.settings.is_empty() {
        prompt(spec, state, io);
        return;
    }
    let (method, params) = state.settings.remove(0);
    send(state, io, SETTING, method, params);
}

fn prompt(spec: &TurnSpec, state: &mut State, io: &mut AdapterIo) {
    let Some(session) = state.session_id.clone() else {
        return;
    };
    if state.interrupt_pending {
        // Interrupted before its prompt: nothing ran.
        state.terminal = Some(Terminal::Aborted);
        io.note(Note::Terminal);
        io.stdin = None;
        return;
    }
    let mut text = spec.prompt.clone();
    if let Some(instructions) = &spec.instructions {
        // ACP has no system prompt of the client's: the platform's
        // instructions lead the turn's prompt.
        text = format!(
            "<instructions>\n{}\n</instructions>\n\n{text}",
            instructions.text
        );
    }
    state.prompted = true;
    state.system_error = None;
    send(
        state,
        io,
        PROMPT,
        "session/prompt",
        json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}),
    );
}

/// The prompt's answer: the terminal event.
fn prompt_ended(state: &mut State, io: &mut AdapterIo, result: &Value) {
    let PromptResult { stop_reason, usage } = lenient::read(result);
    flush_chunks(state, io);
    if let Some(u) = usage {
        state.usage = Usage {
            model: state.usage.model.take(),
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cache_read_tokens: u.cached_read_tokens,
            cache_write_tokens: u.cached_write_tokens,
            cost_usd: state.usage.cost_usd,
        };
    }
    state.terminal = Some(match (stop_reason.as_deref(), state.system_error.take()) {
        (Some("cancelled"), _) => Terminal::Aborted,
        (_, Some(text)) => Terminal::Failed(system_error(&text)),
        // `end_turn`, `max_tokens`, `max_turn_requests`, `refusal`: the
        // agent ended its turn (what it said is in the events).
        _ => Terminal::Completed,
    });
    io.note(Note::Terminal);
    io.stdin = None;
}

/// The failure of a turn whose agent reported a system error, classified
/// from the text it said since (Codex's: "exceeded retry limit, last
/// status: 429 …", "unexpected status 529 …"), else `agent_crashed`.
fn system_error(text: &str) -> AgentError {
    let text = text.trim();
    let code = classify::from_text(text, false).unwrap_or(ErrorCode::AgentCrashed);
    let message = if text.is_empty() {
        "the ACP agent reported a system error and ended its turn".to_string()
    } else {
        format!("the ACP agent reported a system error: {text}")
    };
    AgentError::new(code, classify::clip(&message))
}

/// A request of the agent's was refused (or failed): the turn fails; a
/// refused `session/load` with `resume_failed`.
fn refused(
    spec: &TurnSpec,
    state: &mut State,
    io: &mut AdapterIo,
    which: Option<u64>,
    error: &Value,
) {
    let text = error_text(error);
    let step = match which {
        Some(INITIALIZE) => "initialize",
        Some(SESSION) if spec.resume.is_some() && state.loading => "session/load",
        Some(SESSION) => "session/new",
        Some(PROMPT) => "session/prompt",
        _ => "a request",
    };
    let message = classify::clip(&format!("the ACP agent refused {step}: {text}"));
    let code = if step == "session/load" {
        ErrorCode::ResumeFailed
    } else {
        classify::from_text(&text, false).unwrap_or(ErrorCode::AgentCrashed)
    };
    flush_chunks(state, io);
    let error = AgentError::new(code, message);
    if which == Some(PROMPT) {
        state.terminal = Some(Terminal::Failed(error));
        io.note(Note::Terminal);
    } else {
        if state.failure.is_none() {
            state.failure = Some(error);
        }
        // Nothing more will happen, and an ACP agent need not exit at the
        // end of its input (found by a review: the turn waited for the
        // idle watchdog): its tree is stopped now.
        io.note(Note::TerminalStopNow);
    }
    io.stdin = None;
}

/// An error object's message with its `data` (where agents put the
/// provider's status and message), for the classifier.
fn error_text(error: &Value) -> String {
    let message = jsonrpc::error_message(error);
    match error.get("data") {
        Some(Value::String(s)) => format!("{message}: {s}"),
        Some(data @ Value::Object(_)) => format!("{message}: {data}"),
        _ => message,
    }
}

fn notification(
    state: &mut State,
    io: &mut AdapterIo,
    method: &str,
    params: &Value,
    whole: &Value,
) {
    if method != "session/update" {
        emit(io, method, params, whole);
        return;
    }
    if state.loading {
        // The history of the session being loaded.
        io.note(Note::Activity);
        return;
    }
    if of_another_session(state, params) {
        tracing::debug!("an update of another session than the turn's; not forwarded");
        return;
    }
    let Update { update } = lenient::read(params);
    let kind = update
        .get("sessionUpdate")
        .and_then(Value::as_str)
        .unwrap_or("session/update")
        .to_string();
    match kind.as_str() {
        "agent_message_chunk" | "agent_thought_chunk" => {
            let text = update
                .pointer("/content/text")
                .and_then(Value::as_str)
                .unwrap_or("");
            if let Some(error) = state.system_error.as_mut()
                && kind == "agent_message_chunk"
            {
                // Its start (a proxy's HTML page may follow the status).
                let room = MAX_SYSTEM_ERROR.saturating_sub(error.len());
                error.push_str(prefix(text, room));
            }
            // Another kind, or as long as a line of output may be: the
            // message so far is one event (memory stays bounded, and an
            // agent's flood cannot make one event the coordinator refuses).
            if state
                .chunks
                .as_ref()
                .is_some_and(|(k, t)| *k != kind || t.len() + text.len() > MAX_JOINED)
            {
                flush_chunks(state, io);
            }
            let (_, joined) = state
                .chunks
                .get_or_insert_with(|| (kind.clone(), String::new()));
            joined.push_str(text);
            io.note(Note::Activity);
            return;
        }
        "tool_call" | "tool_call_update" => state.effects = Effects::Some,
        // Only once the turn's session is known (an agent's status of
        // another session, before it, is not the turn's), and a thread
        // active again has recovered from an earlier error.
        "session_info_update" if state.session_id.is_some() => {
            match update
                .pointer("/_meta/codex/threadStatus/type")
                .and_then(Value::as_str)
            {
                Some("systemError") => state.system_error = Some(String::new()),
                Some("active") => state.system_error = None,
                _ => {}
            }
        }
        "usage_update" => {
            if let Some(cost) = update
                .pointer("/cost/amount")
                .and_then(Value::as_f64)
                .filter(|_| update.pointer("/cost/currency").and_then(Value::as_str) == Some("USD"))
            {
                state.usage.cost_usd = Some(cost);
            }
        }
        _ => {}
    }
    flush_chunks(state, io);
    emit(io, &kind, &update, whole);
}

/// The first `max` bytes of `text`, cut at a character's start.
fn prefix(text: &str, max: usize) -> &str {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default()
}

/// The message streamed so far, as one event (`agent_message_chunk` or
/// `agent_thought_chunk`, `{"text"}`).
fn flush_chunks(state: &mut State, io: &AdapterIo) {
    if let Some((kind, text)) = state.chunks.take() {
        let data = json!({"text": text});
        emit(io, &kind, &data, &data);
    }
}

/// An event of type `kind` with `data`; `whole` (the agent's message) is
/// the text of the `output` event a refused type becomes (4.6).
fn emit(io: &AdapterIo, kind: &str, data: &Value, whole: &Value) {
    let redactor = io.events.fresh_redactor();
    io.events.emit_agent(AgentEvent::named(
        redactor,
        kind.to_string(),
        data.clone(),
        || whole.clone(),
    ));
}

/// A request of the agent's: a permission is granted (its event first);
/// anything else (file-system or terminal methods the runner does not
/// offer) is refused.
fn request(
    spec: &TurnSpec,
    state: &mut State,
    io: &mut AdapterIo,
    id: &Value,
    method: &str,
    params: &Value,
    whole: &Value,
) {
    flush_chunks(state, io);
    if method != "session/request_permission" {
        emit(io, method, params, whole);
        reply(
            io,
            jsonrpc::error_response(id, -32601, "hosted-boot offers no such method"),
        );
        return;
    }
    if of_another_session(state, params) {
        // As its updates are dropped: nothing of another session is granted.
        tracing::debug!("a permission request of another session than the turn's; cancelled");
        reply(
            io,
            jsonrpc::response(id, json!({"outcome": {"outcome": "cancelled"}})),
        );
        return;
    }
    let answer = permission_answer(spec.acp_permissions, params);
    // The request with the runner's answer: what the agent was allowed is
    // in the run's events.
    let mut data = params.clone();
    if let Some(fields) = data.as_object_mut() {
        fields.insert("runnerAnswer".into(), answer.clone());
    }
    emit(io, method, &data, whole);
    reply(io, jsonrpc::response(id, answer));
}

/// Sends an answer to a request of the agent's, as JSON-RPC 2.0.
fn reply(io: &AdapterIo, mut message: Value) {
    message["jsonrpc"] = json!("2.0");
    io.send_json(&message);
}

/// Whether `params` name a session other than the turn's (once it is
/// known; a message naming none is the turn's).
fn of_another_session(state: &State, params: &Value) -> bool {
    let about = params.get("sessionId").and_then(Value::as_str);
    matches!((state.session_id.as_deref(), about), (Some(ours), Some(about)) if ours != about)
}

/// The answer to `session/request_permission` under `policy`: the
/// agent's "allow once" (or "reject once") option, else (an agent that
/// offers no such option) its "allow always" (or "reject always") one,
/// else `cancelled` (no option says it). Once rather than always where
/// there is a choice: an "always" answer writes rules into the agent's
/// settings (Claude Code's: in `repo/.claude/`, which the harvest would
/// push). The kind is chosen first: an option of that kind whose id is
/// not a string, or whose id another kind of option shares, is
/// `cancelled`, never the next kind's.
fn permission_answer(policy: AcpPermissions, params: &Value) -> Value {
    let Permission { options } = lenient::read(params);
    let options = options.unwrap_or_default();
    let kinds = match policy {
        AcpPermissions::Allow => ["allow_once", "allow_always"],
        AcpPermissions::Reject => ["reject_once", "reject_always"],
    };
    let chosen = kinds
        .iter()
        .find_map(|kind| options.iter().find(|o| o.kind.as_deref() == Some(*kind)));
    let pick = chosen.and_then(|o| o.option_id.clone()).filter(|id| {
        options
            .iter()
            .filter(|o| o.option_id.as_deref() == Some(id.as_str()))
            .all(|o| o.kind == chosen.and_then(|c| c.kind.clone()))
    });
    match pick {
        Some(option) => json!({"outcome": {"outcome": "selected", "optionId": option}}),
        None => json!({"outcome": {"outcome": "cancelled"}}),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Initialized {
    #[serde(deserialize_with = "lenient::object")]
    agent_capabilities: Capabilities,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Capabilities {
    #[serde(deserialize_with = "lenient::value")]
    load_session: Option<bool>,
}

/// `session/new`'s (and `session/load`'s) result.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Opened {
    #[serde(deserialize_with = "lenient::value")]
    session_id: Option<String>,
    #[serde(deserialize_with = "lenient::object")]
    modes: Modes,
    #[serde(deserialize_with = "lenient::list")]
    config_options: Option<Vec<ConfigOption>>,
}

/// A session configuration option (`select`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
struct ConfigOption {
    #[serde(deserialize_with = "lenient::value")]
    id: Option<String>,
    #[serde(deserialize_with = "lenient::value")]
    category: Option<String>,
    #[serde(deserialize_with = "lenient::list")]
    options: Option<Vec<ConfigValue>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
struct ConfigValue {
    #[serde(deserialize_with = "lenient::value")]
    value: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Modes {
    #[serde(deserialize_with = "lenient::value")]
    current_mode_id: Option<String>,
    #[serde(deserialize_with = "lenient::list")]
    available_modes: Option<Vec<Mode>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
struct Mode {
    #[serde(deserialize_with = "lenient::value")]
    id: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct PromptResult {
    #[serde(deserialize_with = "lenient::value")]
    stop_reason: Option<String>,
    #[serde(deserialize_with = "lenient::non_null")]
    usage: Option<PromptUsage>,
}

/// ACP's `usage` of a prompt (an unstable field; Claude Code's agent sends
/// it).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct PromptUsage {
    #[serde(deserialize_with = "lenient::count")]
    input_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::count")]
    output_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::count")]
    cached_read_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::count")]
    cached_write_tokens: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Update {
    update: Value,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Permission {
    #[serde(deserialize_with = "lenient::list")]
    options: Option<Vec<PermissionOption>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct PermissionOption {
    #[serde(deserialize_with = "lenient::value")]
    option_id: Option<String>,
    #[serde(deserialize_with = "lenient::value")]
    kind: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(model: Option<&str>, effort: Option<&str>) -> TurnSpec {
        TurnSpec {
            prompt: "p".into(),
            cwd: "/r".into(),
            resume: None,
            model: model.map(str::to_string),
            effort: effort.map(str::to_string),
            extra_args: Vec::new(),
            opencode_port: None,
            timings: super::super::AgentTimings::default(),
            instructions: None,
            wrap_up: None,
            acp_permissions: Default::default(),
        }
    }

    /// As Claude Code's ACP agent 0.101.0 answers `session/new`.
    fn opened() -> Opened {
        lenient::read(&json!({
            "sessionId": "s",
            "modes": {"currentModeId": "auto", "availableModes": [
                {"id": "default"}, {"id": "auto"}, {"id": "bypassPermissions"}]},
            "configOptions": [
                {"id": "mode", "category": "mode", "options": [{"value": "auto"}]},
                {"id": "model", "category": "model", "options": [{"value": "default"}, {"value": "sonnet"}]},
                {"id": "effort", "category": "thought_level", "options": [{"value": "low"}, {"value": "high"}]}
            ]
        }))
    }

    #[test]
    fn the_unattended_mode_then_the_offered_model_and_effort() {
        let set = settings(&spec(Some("sonnet"), Some("high")), "s", &opened());
        assert_eq!(
            set,
            vec![
                (
                    "session/set_mode",
                    json!({"sessionId": "s", "modeId": "bypassPermissions"})
                ),
                (
                    "session/set_config_option",
                    json!({"sessionId": "s", "configId": "model", "value": "sonnet"})
                ),
                (
                    "session/set_config_option",
                    json!({"sessionId": "s", "configId": "effort", "value": "high"})
                ),
            ]
        );
        // A model or effort the agent does not offer is not sent; a mode
        // already current, or none offered, is not set.
        let set = settings(
            &spec(Some("claude-sonnet-4-5"), Some("extreme")),
            "s",
            &opened(),
        );
        assert_eq!(set.len(), 1);
        // Under reject the mode that asks is set (Claude Code's `default`;
        // its own default mode, `auto`, writes files unasked).
        let rejecting = TurnSpec {
            acp_permissions: AcpPermissions::Reject,
            ..spec(Some("sonnet"), None)
        };
        assert_eq!(
            settings(&rejecting, "s", &opened())
                .iter()
                .map(|(m, _)| *m)
                .collect::<Vec<_>>(),
            vec!["session/set_mode", "session/set_config_option"]
        );
        assert_eq!(
            settings(&rejecting, "s", &opened())[0].1["modeId"],
            "default"
        );
        let bare: Opened =
            lenient::read(&json!({"sessionId": "s", "modes": {"currentModeId": "yolo",
            "availableModes": [{"id": "yolo"}]}}));
        assert!(settings(&spec(None, None), "s", &bare).is_empty());
    }

    fn options(kinds: &[&str]) -> Value {
        json!({"options": kinds.iter().map(|k| json!({"optionId": format!("id-{k}"), "kind": k})).collect::<Vec<_>>()})
    }

    #[test]
    fn permissions_are_granted_once() {
        let allow = |p: &Value| permission_answer(AcpPermissions::Allow, p);
        assert_eq!(
            allow(&options(&["allow_always", "allow_once", "reject_once"])),
            json!({"outcome": {"outcome": "selected", "optionId": "id-allow_once"}})
        );
        assert_eq!(
            allow(&options(&["reject_once", "allow_always"])),
            json!({"outcome": {"outcome": "selected", "optionId": "id-allow_always"}})
        );
        assert_eq!(
            allow(&options(&["reject_once"])),
            json!({"outcome": {"outcome": "cancelled"}})
        );
        assert_eq!(
            allow(&json!({"options": "junk"})),
            json!({"outcome": {"outcome": "cancelled"}})
        );
    }

    #[test]
    fn permissions_are_rejected_once_under_reject() {
        let reject = |p: &Value| permission_answer(AcpPermissions::Reject, p);
        assert_eq!(
            reject(&options(&["allow_once", "reject_always", "reject_once"])),
            json!({"outcome": {"outcome": "selected", "optionId": "id-reject_once"}})
        );
        assert_eq!(
            reject(&options(&["allow_once", "reject_always"])),
            json!({"outcome": {"outcome": "selected", "optionId": "id-reject_always"}})
        );
        // No option refuses: cancelled, never a grant.
        assert_eq!(
            reject(&options(&["allow_once", "allow_always"])),
            json!({"outcome": {"outcome": "cancelled"}})
        );
    }

    /// As Codex's ACP agent 2.6.0 words its provider errors.
    #[test]
    fn a_system_error_is_classified_from_its_text() {
        let code = |t: &str| system_error(t).code;
        assert_eq!(
            code("exceeded retry limit, last status: 429 Too Many Requests\n\n"),
            ErrorCode::ProviderLimitUnknown
        );
        assert_eq!(
            code("unexpected status 529 <unknown status code>: The server is overloaded."),
            ErrorCode::ProviderOverloaded
        );
        assert_eq!(code(""), ErrorCode::AgentCrashed);
    }

    #[test]
    fn an_errors_data_goes_to_the_classifier() {
        assert_eq!(
            error_text(
                &json!({"code": -32603, "message": "Internal error", "data": "429 rate limited"})
            ),
            "Internal error: 429 rate limited"
        );
        assert_eq!(error_text(&json!({"code": -1, "message": "no"})), "no");
    }
}
