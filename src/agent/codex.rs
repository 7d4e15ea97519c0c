//! Codex (`--agent codex`): `codex app-server [--agent-arg …]`, one process
//! per turn, JSON-RPC over stdio (one JSON object a line, no `"jsonrpc"`
//! member):
//!
//! ```text
//! → initialize {clientInfo}            ← result      → initialized
//! → thread/start {cwd, approvalPolicy: "never", sandbox: "danger-full-access", model?}
//!   | thread/resume {threadId, cwd, approvalPolicy, sandbox}   ← {thread: {id}}
//! → turn/start {threadId, input: [{type: "text", text: <prompt>}], model?, effort?}
//! ← notifications … turn/completed {turn: {id, status, error?}}
//! (interrupt: → turn/interrupt {threadId, turnId})
//! ```
//!
//! Stdin is closed after `turn/completed` (the server exits at EOF). The
//! thread id is the agent session id. Server requests (approvals, user
//! input) are declined: with approval policy `never` none should come, and
//! an unanswered one would stall the turn. Token deltas are not forwarded
//! as events. Failures are classified from `codexErrorInfo`, then the
//! message text.

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use serde_json::{Value, json};

use super::classify::{self, from_http_status};
use super::command::{JsonLines, event_for_line};
use super::jsonrpc::{self, Message};
use super::usage::Totals;
use super::usage::as_u64;
use super::{
    Adapter, AdapterCommand, AdapterIo, AgentError, Effects, ExitRule, Launch, Note, Observation,
    StdinMode, Terminal, TurnSpec, Usage,
};
use crate::events::event::{AgentEvent, TextStream};
use crate::process::supervisor::Stream;
use crate::wire::ErrorCode;

const INITIALIZE: u64 = 0;
const THREAD: u64 = 1;
const TURN: u64 = 2;
const INTERRUPT: u64 = 3;

/// The Codex app-server adapter for one process.
pub struct CodexAdapter {
    spec: TurnSpec,
}

impl CodexAdapter {
    /// For one turn.
    pub fn new(spec: TurnSpec) -> Self {
        CodexAdapter { spec }
    }
}

impl Adapter for CodexAdapter {
    fn launch(&self) -> Launch {
        let mut args = vec!["app-server".to_string()];
        args.extend(self.spec.extra_args.iter().cloned());
        Launch {
            args,
            env: Vec::new(),
            stdin: StdinMode::Channel,
            protocol_interrupt: true,
            server: false,
            exit_rule: ExitRule::NeedsTerminal,
            stop_signal: rustix::process::Signal::INT,
        }
    }

    fn run(self: Box<Self>, io: AdapterIo) -> BoxFuture<'static, Observation> {
        run(self.spec, io).boxed()
    }
}

#[derive(Debug, Default)]
struct State {
    thread_id: Option<String>,
    turn_id: Option<String>,
    interrupt_pending: bool,
    model: Option<String>,
    /// `total - last` of the first usage notice: the thread's total before
    /// this turn.
    baseline: Option<Usage>,
    total: Option<Usage>,
    effects: Effects,
    terminal: Option<Terminal>,
    failure: Option<AgentError>,
    /// The last non-retried `error` notification.
    last_error: Option<AgentError>,
}

async fn run(spec: TurnSpec, mut io: AdapterIo) -> Observation {
    let mut state = State {
        model: spec.model.clone(),
        ..State::default()
    };
    io.send_json(&jsonrpc::request(
        INITIALIZE,
        "initialize",
        json!({"clientInfo": {
            "name": "hosted_boot",
            "title": "hosted-boot",
            "version": env!("CARGO_PKG_VERSION"),
        }}),
    ));
    let mut json_lines = JsonLines::new();
    let mut commands_open = true;
    loop {
        tokio::select! {
            line = io.lines.recv() => {
                let Some((stream, line)) = line else { break };
                match stream {
                    Stream::Stderr => {
                        io.events
                            .emit_agent(event_for_line(io.events.fresh_redactor(), stream, &line));
                    }
                    Stream::Stdout => match json_lines.push(&line) {
                        Some(obj) => handle(&spec, &mut state, &mut io, &Value::Object(obj)),
                        None => {
                            io.events
                                .emit_agent(event_for_line(io.events.fresh_redactor(), stream, &line));
                        }
                    },
                }
            }
            cmd = io.commands.recv(), if commands_open => match cmd {
                Some(AdapterCommand::ProtocolInterrupt) => interrupt(&mut state, &mut io),
                None => commands_open = false,
            },
        }
    }
    let usage = match (&state.total, &state.baseline) {
        (Some(total), Some(base)) => total.minus(base),
        _ => Usage::default(),
    };
    let usage = Usage {
        model: state.model.clone(),
        ..usage
    };
    Observation {
        terminal: state.terminal,
        failure: state.failure.or(state.last_error),
        usage,
        effects: state.effects,
    }
}

fn interrupt(state: &mut State, io: &mut AdapterIo) {
    if state.terminal.is_some() {
        return;
    }
    match (&state.thread_id, &state.turn_id) {
        (Some(thread), Some(turn)) => {
            io.send_json(&jsonrpc::request(
                INTERRUPT,
                "turn/interrupt",
                json!({"threadId": thread, "turnId": turn}),
            ));
        }
        (Some(_), None) => state.interrupt_pending = true,
        // No thread yet: nothing runs; closing stdin ends the server.
        (None, _) => io.stdin = None,
    }
}

fn start_turn(spec: &TurnSpec, state: &State, io: &AdapterIo) {
    let Some(thread) = &state.thread_id else {
        return;
    };
    let mut params = json!({
        "threadId": thread,
        "input": [{"type": "text", "text": spec.prompt}],
    });
    if let Some(m) = &spec.model {
        params["model"] = json!(m);
    }
    if let Some(e) = &spec.effort {
        params["effort"] = json!(e);
    }
    io.send_json(&jsonrpc::request(TURN, "turn/start", params));
}

fn handle(spec: &TurnSpec, state: &mut State, io: &mut AdapterIo, value: &Value) {
    let Some(message) = jsonrpc::parse(value) else {
        let redactor = io.events.fresh_redactor();
        io.events.emit_agent(AgentEvent::text(
            redactor,
            TextStream::Stdout,
            value.to_string(),
            false,
        ));
        return;
    };
    match message {
        Message::Response { id, result } => response(spec, state, io, id.as_u64(), result),
        Message::Notification { method, params } => {
            if !(method.ends_with("delta") || method.ends_with("Delta")) {
                let redactor = io.events.fresh_redactor();
                let event =
                    AgentEvent::named(redactor, method.clone(), params.clone(), || value.clone());
                io.events.emit_agent(event);
            } else {
                io.note(Note::Activity);
            }
            notification(state, io, &method, &params);
        }
        Message::Request { id, method, params } => {
            let redactor = io.events.fresh_redactor();
            let event = AgentEvent::named(redactor, method.clone(), params, || value.clone());
            io.events.emit_agent(event);
            let answer = if method.ends_with("requestApproval") {
                jsonrpc::response(&id, json!({"decision": "decline"}))
            } else {
                jsonrpc::error_response(&id, -32601, "hosted-boot does not answer this request")
            };
            io.send_json(&answer);
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
    match (id, result) {
        (Some(INITIALIZE), Ok(_)) => start_thread(spec, io),
        (Some(THREAD), Ok(result)) => {
            if let Some(m) = result.get("model").and_then(Value::as_str) {
                state.model = Some(m.to_string());
            }
            let id = result
                .get("thread")
                .and_then(|t| t.get("id"))
                .and_then(Value::as_str);
            if let Some(id) = id {
                set_thread(state, io, id);
            }
            start_turn(spec, state, io);
        }
        (Some(TURN), Ok(result)) => {
            if state.turn_id.is_none() {
                state.turn_id = result
                    .get("turn")
                    .and_then(|t| t.get("id"))
                    .and_then(Value::as_str)
                    .map(str::to_string);
            }
            if state.interrupt_pending {
                state.interrupt_pending = false;
                interrupt(state, io);
            }
        }
        (Some(INTERRUPT), _) => {}
        (which, Err(error)) => refused(spec, state, io, which, &error),
        (_, Ok(_)) => {}
    }
}

/// `initialize` answered: `initialized`, then `thread/resume` of the agent
/// session or `thread/start` with the model.
fn start_thread(spec: &TurnSpec, io: &AdapterIo) {
    io.send_json(&jsonrpc::notification("initialized"));
    let common = |mut p: Value| {
        p["cwd"] = json!(spec.cwd.to_string_lossy());
        p["approvalPolicy"] = json!("never");
        p["sandbox"] = json!("danger-full-access");
        // A field of the thread request, on resume too (a resumed thread
        // is loaded afresh by this server).
        if let Some(i) = &spec.instructions {
            p["developerInstructions"] = json!(i.text);
        }
        p
    };
    match &spec.resume {
        Some(id) => io.send_json(&jsonrpc::request(
            THREAD,
            "thread/resume",
            // The thread's earlier turns are not needed (only its id), and
            // codex 0.171.0's deprecation notice asks for this.
            common(json!({"threadId": id, "excludeTurns": true})),
        )),
        None => {
            let mut p = common(json!({}));
            if let Some(m) = &spec.model {
                p["model"] = json!(m);
            }
            io.send_json(&jsonrpc::request(THREAD, "thread/start", p))
        }
    };
}

/// A request of the setup was refused: the turn fails (a refused
/// `thread/resume` with `resume_failed`), and the server may exit.
fn refused(
    spec: &TurnSpec,
    state: &mut State,
    io: &mut AdapterIo,
    which: Option<u64>,
    error: &Value,
) {
    let text = jsonrpc::error_message(error);
    let step = match which {
        Some(INITIALIZE) => "initialize",
        Some(THREAD) if spec.resume.is_some() => "thread/resume",
        Some(THREAD) => "thread/start",
        Some(TURN) => "turn/start",
        _ => "a request",
    };
    let message = classify::clip(&format!("codex app-server refused {step}: {text}"));
    let code = if which == Some(THREAD) && spec.resume.is_some() {
        ErrorCode::ResumeFailed
    } else {
        classify::from_text(&text, false).unwrap_or(ErrorCode::AgentCrashed)
    };
    if state.failure.is_none() {
        state.failure = Some(AgentError::new(code, message));
    }
    // Nothing more will happen: let the server exit.
    io.stdin = None;
}

fn set_thread(state: &mut State, io: &AdapterIo, id: &str) {
    if state.thread_id.is_none() {
        state.thread_id = Some(id.to_string());
        io.note(Note::SessionId(id.to_string()));
    }
}

/// Item types that are only talk: everything else may have had an effect.
const TALK_ITEMS: &[&str] = &["agentMessage", "reasoning", "userMessage", "plan"];

fn notification(state: &mut State, io: &mut AdapterIo, method: &str, params: &Value) {
    match method {
        "thread/started" => {
            if let Some(id) = params
                .get("thread")
                .and_then(|t| t.get("id"))
                .and_then(Value::as_str)
            {
                set_thread(state, io, id);
            }
        }
        "turn/started" if state.turn_id.is_none() => {
            state.turn_id = params
                .get("turn")
                .and_then(|t| t.get("id"))
                .and_then(Value::as_str)
                .map(str::to_string);
        }
        "item/started" | "item/completed" => {
            let kind = params
                .get("item")
                .and_then(|i| i.get("type"))
                .and_then(Value::as_str)
                .unwrap_or("");
            if !TALK_ITEMS.contains(&kind) {
                state.effects = Effects::Some;
            }
        }
        // After `thread/resume`, codex 0.171.0 replays the previous turn's
        // notice (with that turn's id) before `turn/started`: only this
        // turn's notices count (PROTOCOL.md 7: usage is never cumulative).
        "thread/tokenUsage/updated"
            if state.turn_id.is_none()
                || params
                    .get("turnId")
                    .and_then(Value::as_str)
                    .is_some_and(|t| Some(t) != state.turn_id.as_deref()) => {}
        "thread/tokenUsage/updated" => {
            let usage = params.get("tokenUsage");
            let total = usage.and_then(|u| u.get("total")).map(breakdown);
            let last = usage.and_then(|u| u.get("last")).map(breakdown);
            if state.baseline.is_none()
                && let (Some(t), Some(l)) = (&total, &last)
            {
                state.baseline = Some(t.minus(l));
            }
            if total.is_some() {
                state.total = total;
            }
        }
        "error" => {
            let will_retry = params
                .get("willRetry")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if !will_retry && let Some(e) = params.get("error") {
                state.last_error = Some(classify_error(e));
            }
        }
        "turn/completed" => turn_completed(state, io, params),
        _ => {}
    }
}

/// `turn/completed` of this process's turn: the terminal event.
fn turn_completed(state: &mut State, io: &mut AdapterIo, params: &Value) {
    let turn = params.get("turn");
    let id = turn.and_then(|t| t.get("id")).and_then(Value::as_str);
    if let (Some(mine), Some(id)) = (&state.turn_id, id)
        && mine != id
    {
        return;
    }
    let status = turn
        .and_then(|t| t.get("status"))
        .and_then(Value::as_str)
        .unwrap_or("");
    state.terminal = Some(match status {
        "completed" => Terminal::Completed,
        "interrupted" => Terminal::Aborted,
        _ => {
            let error = turn.and_then(|t| t.get("error")).filter(|e| !e.is_null());
            match (error, &state.last_error) {
                (Some(e), _) => Terminal::Failed(classify_error(e)),
                (None, Some(last)) => Terminal::Failed(last.clone()),
                (None, None) => Terminal::Failed(AgentError::new(
                    ErrorCode::AgentCrashed,
                    format!("the turn ended {status:?} without an error"),
                )),
            }
        }
    });
    io.note(Note::Terminal);
    io.stdin = None;
}

/// A `TokenUsageBreakdown` (`inputTokens` includes the cached part, which
/// is reported apart).
fn breakdown(v: &Value) -> Usage {
    let input = as_u64(v.get("inputTokens"));
    let cached = as_u64(v.get("cachedInputTokens"));
    Usage {
        model: None,
        input_tokens: input.map(|i| i.saturating_sub(cached.unwrap_or(0))),
        output_tokens: as_u64(v.get("outputTokens")),
        cache_read_tokens: cached,
        cache_write_tokens: None,
        cost_usd: None,
    }
}

/// Classifies a Codex error `{message, codexErrorInfo?, additionalDetails?}`
/// (app-server); shared with `codex exec`, whose errors have only a message.
pub fn classify_error(error: &Value) -> AgentError {
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let details = error
        .get("additionalDetails")
        .and_then(Value::as_str)
        .unwrap_or("");
    let text = if details.is_empty() {
        message.clone()
    } else {
        format!("{message} ({details})")
    };
    let err = |code| AgentError::new(code, classify::clip(&text));
    // Unit variants are strings; struct variants `{"name": {fields}}`.
    let info = error.get("codexErrorInfo");
    let (name, fields) = match info {
        Some(Value::String(s)) => (s.as_str(), None),
        Some(Value::Object(m)) if m.len() == 1 => match m.iter().next() {
            Some((k, v)) => (k.as_str(), Some(v)),
            None => ("", None),
        },
        _ => ("", None),
    };
    let http = fields
        .and_then(|f| f.get("httpStatusCode"))
        .and_then(|s| as_u64(Some(s)))
        .and_then(|s| u16::try_from(s).ok());
    match name {
        "usageLimitExceeded" => err(ErrorCode::ProviderQuotaExhausted),
        "serverOverloaded" => err(ErrorCode::ProviderOverloaded),
        "contextWindowExceeded" => err(ErrorCode::ContextWindowExceeded),
        "unauthorized" => err(ErrorCode::ProviderAuth),
        "badRequest" | "cyberPolicy" => err(ErrorCode::InvalidRequest),
        "internalServerError" => err(ErrorCode::ProviderServerError),
        "httpConnectionFailed"
        | "responseStreamConnectionFailed"
        | "responseStreamDisconnected"
        | "responseTooManyFailedAttempts" => match http {
            // "exceeded retry limit, last status: 429 Too Many Requests" is
            // a 429 and its reason phrase: no evidence of a throttle rather
            // than a quota, so never assumed to be a plain rate limit. Only
            // the provider's own wording ("Rate limit reached …") is.
            Some(429) => {
                let lower = text.to_lowercase();
                if classify::from_text(&text, false) == Some(ErrorCode::ProviderQuotaExhausted) {
                    err(ErrorCode::ProviderQuotaExhausted)
                } else if lower.contains("rate limit") || lower.contains("rate_limit") {
                    err(ErrorCode::ProviderRateLimited)
                        .retry_after(classify::retry_after_in_text(&text))
                } else {
                    err(ErrorCode::ProviderLimitUnknown)
                }
            }
            Some(s) => err(from_http_status(s, &text)),
            None => {
                err(classify::from_text(&text, false).unwrap_or(ErrorCode::ProviderServerError))
            }
        },
        _ => err(classify::from_text(&text, false).unwrap_or(ErrorCode::AgentCrashed)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codex_error_info_decides_first() {
        let c = |v: Value| classify_error(&v).code;
        assert_eq!(
            c(
                json!({"message": "You've hit your usage limit.", "codexErrorInfo": "usageLimitExceeded"})
            ),
            ErrorCode::ProviderQuotaExhausted
        );
        assert_eq!(
            c(
                json!({"message": "exceeded retry limit, last status: 429 Too Many Requests",
                     "codexErrorInfo": {"responseTooManyFailedAttempts": {"httpStatusCode": 429}}})
            ),
            ErrorCode::ProviderLimitUnknown
        );
        assert_eq!(
            c(
                json!({"message": "Selected model is at capacity.", "codexErrorInfo": "serverOverloaded"})
            ),
            ErrorCode::ProviderOverloaded
        );
        assert_eq!(
            c(json!({"message": "x", "codexErrorInfo": "contextWindowExceeded"})),
            ErrorCode::ContextWindowExceeded
        );
        assert_eq!(
            c(json!({"message": "x", "codexErrorInfo": "unauthorized"})),
            ErrorCode::ProviderAuth
        );
        assert_eq!(
            c(json!({"message": "x", "codexErrorInfo": "badRequest"})),
            ErrorCode::InvalidRequest
        );
        assert_eq!(
            c(
                json!({"message": "We're currently experiencing high demand", "codexErrorInfo": "internalServerError"})
            ),
            ErrorCode::ProviderServerError
        );
        assert_eq!(
            c(
                json!({"message": "stream disconnected", "codexErrorInfo": {"responseStreamDisconnected": {"httpStatusCode": null}}})
            ),
            ErrorCode::ProviderServerError
        );
        // No info: the text.
        assert_eq!(
            c(json!({"message": "Quota exceeded. Check your plan and billing details."})),
            ErrorCode::ProviderQuotaExhausted
        );
        assert_eq!(c(json!({"message": "boom"})), ErrorCode::AgentCrashed);
        let e = classify_error(&json!({
            "message": "Rate limit reached for gpt-5 on tokens per min (TPM). Please try again in 2.4s.",
            "codexErrorInfo": {"httpConnectionFailed": {"httpStatusCode": 429}}}));
        assert_eq!(
            (e.code, e.retry_after_ms),
            (ErrorCode::ProviderRateLimited, Some(2400))
        );
    }

    #[test]
    fn usage_breakdown_separates_cached_input() {
        let u = breakdown(&json!({"inputTokens": 100, "cachedInputTokens": 30, "outputTokens": 7}));
        assert_eq!(u.input_tokens, Some(70));
        assert_eq!(u.cache_read_tokens, Some(30));
        assert_eq!(u.output_tokens, Some(7));
    }
}
