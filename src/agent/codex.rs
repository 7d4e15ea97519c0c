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
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::classify::{self, from_http_status};
use super::jsonrpc::{self, Message};
use super::lenient;
use super::usage::Totals;
use super::{
    Adapter, AdapterIo, AgentError, Effects, ExitRule, Launch, Note, Observation, StdinMode,
    Terminal, TurnSpec, Usage,
};
use crate::events::event::{AgentEvent, TextStream};
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
            wrap_up: false,
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
        Initialize {
            client_info: ClientInfo {
                name: "hosted_boot",
                title: "hosted-boot",
                version: env!("CARGO_PKG_VERSION"),
            },
        },
    ));
    jsonrpc::serve(
        &mut io,
        &mut state,
        |state, io, value| handle(&spec, state, io, value),
        interrupt,
    )
    .await;
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
                Interrupt {
                    thread_id: thread,
                    turn_id: turn,
                },
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
    let params = TurnStart {
        effort: spec.effort.as_deref(),
        input: [Input {
            text: &spec.prompt,
            kind: "text",
        }],
        model: spec.model.as_deref(),
        thread_id: thread,
    };
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
            let ThreadResult { model, thread } = lenient::read(&result);
            if let Some(m) = model {
                state.model = Some(m);
            }
            if let Some(id) = &thread.id {
                set_thread(state, io, id);
            }
            start_turn(spec, state, io);
        }
        (Some(TURN), Ok(result)) => {
            if state.turn_id.is_none() {
                state.turn_id = lenient::read::<TurnRef>(&result).turn.id;
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
    let cwd = spec.cwd.to_string_lossy();
    let params = ThreadStart {
        approval_policy: "never",
        cwd: &cwd,
        // A field of the thread request, on resume too (a resumed thread
        // is loaded afresh by this server).
        developer_instructions: spec.instructions.as_ref().map(|i| i.text.as_str()),
        // The thread's earlier turns are not needed (only its id), and
        // codex 0.171.0's deprecation notice asks for this.
        exclude_turns: spec.resume.as_ref().map(|_| true),
        // On resume the model goes with `turn/start` only.
        model: spec.model.as_deref().filter(|_| spec.resume.is_none()),
        sandbox: "danger-full-access",
        thread_id: spec.resume.as_deref(),
    };
    let method = match spec.resume {
        Some(_) => "thread/resume",
        None => "thread/start",
    };
    io.send_json(&jsonrpc::request(THREAD, method, params));
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
    match Notice::read(method, params) {
        Notice::ThreadStarted(ThreadRef { thread }) => {
            if let Some(id) = &thread.id {
                set_thread(state, io, id);
            }
        }
        Notice::TurnStarted(TurnRef { turn }) if state.turn_id.is_none() => {
            state.turn_id = turn.id;
        }
        Notice::Item(ItemParams { item }) => {
            let kind = item.kind.as_deref().unwrap_or("");
            if !TALK_ITEMS.contains(&kind) {
                state.effects = Effects::Some;
            }
        }
        // After `thread/resume`, codex 0.171.0 replays the previous turn's
        // notice (with that turn's id) before `turn/started`: only this
        // turn's notices count (PROTOCOL.md 7: usage is never cumulative).
        Notice::TokenUsage(TokenUsageParams { turn_id, .. })
            if state.turn_id.is_none()
                || turn_id
                    .as_deref()
                    .is_some_and(|t| Some(t) != state.turn_id.as_deref()) => {}
        Notice::TokenUsage(TokenUsageParams { token_usage, .. }) => {
            let total = token_usage.total.as_ref().map(breakdown);
            let last = token_usage.last.as_ref().map(breakdown);
            if state.baseline.is_none()
                && let (Some(t), Some(l)) = (&total, &last)
            {
                state.baseline = Some(t.minus(l));
            }
            if total.is_some() {
                state.total = total;
            }
        }
        Notice::Error(ErrorParams { will_retry, error }) => {
            if !will_retry.unwrap_or(false)
                && let Some(e) = &error
            {
                state.last_error = Some(classify_error(e));
            }
        }
        Notice::TurnCompleted(TurnCompleted { turn }) => turn_completed(state, io, turn),
        _ => {}
    }
}

/// `turn/completed` of this process's turn: the terminal event.
fn turn_completed(state: &mut State, io: &mut AdapterIo, turn: CompletedTurn) {
    if let (Some(mine), Some(id)) = (&state.turn_id, &turn.id)
        && mine != id
    {
        return;
    }
    let status = turn.status.as_deref().unwrap_or("");
    state.terminal = Some(match status {
        "completed" => Terminal::Completed,
        "interrupted" => Terminal::Aborted,
        _ => match (&turn.error, &state.last_error) {
            (Some(e), _) => Terminal::Failed(classify_error(e)),
            (None, Some(last)) => Terminal::Failed(last.clone()),
            (None, None) => Terminal::Failed(AgentError::new(
                ErrorCode::AgentCrashed,
                format!("the turn ended {status:?} without an error"),
            )),
        },
    });
    io.note(Note::Terminal);
    io.stdin = None;
}

/// A `TokenUsageBreakdown` (`inputTokens` includes the cached part, which
/// is reported apart).
fn breakdown(b: &Breakdown) -> Usage {
    Usage {
        model: None,
        input_tokens: b
            .input_tokens
            .map(|i| i.saturating_sub(b.cached_input_tokens.unwrap_or(0))),
        output_tokens: b.output_tokens,
        cache_read_tokens: b.cached_input_tokens,
        cache_write_tokens: None,
        cost_usd: None,
    }
}

/// Classifies a Codex error `{message, codexErrorInfo?, additionalDetails?}`
/// (app-server); shared with `codex exec`, whose errors have only a message.
pub fn classify_error(error: &CodexError) -> AgentError {
    let message = error.message.clone().unwrap_or_default();
    let details = error.additional_details.as_deref().unwrap_or("");
    let text = if details.is_empty() {
        message.clone()
    } else {
        format!("{message} ({details})")
    };
    let err = |code| AgentError::new(code, classify::clip(&text));
    let (name, fields) = match &error.codex_error_info {
        Some(ErrorInfo::Unit(s)) => (s.as_str(), None),
        Some(ErrorInfo::Struct(m)) if m.len() == 1 => match m.iter().next() {
            Some((k, v)) => (k.as_str(), Some(lenient::read::<ErrorInfoFields>(v))),
            None => ("", None),
        },
        _ => ("", None),
    };
    let http = fields
        .and_then(|f| f.http_status_code)
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

/// `initialize`'s params.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Initialize {
    client_info: ClientInfo,
}

#[derive(Serialize)]
struct ClientInfo {
    name: &'static str,
    title: &'static str,
    version: &'static str,
}

/// `thread/start`'s and `thread/resume`'s params. Members are in
/// alphabetical order, as the `json!` objects these replaced wrote them.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ThreadStart<'a> {
    approval_policy: &'static str,
    cwd: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    developer_instructions: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exclude_turns: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<&'a str>,
    sandbox: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    thread_id: Option<&'a str>,
}

/// `turn/start`'s params.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TurnStart<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    effort: Option<&'a str>,
    input: [Input<'a>; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<&'a str>,
    thread_id: &'a str,
}

#[derive(Serialize)]
struct Input<'a> {
    text: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
}

/// `turn/interrupt`'s params.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Interrupt<'a> {
    thread_id: &'a str,
    turn_id: &'a str,
}

/// `{id}` of a thread or a turn.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Id {
    #[serde(deserialize_with = "lenient::value")]
    id: Option<String>,
}

/// The result of `thread/start` or `thread/resume`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ThreadResult {
    #[serde(deserialize_with = "lenient::value")]
    model: Option<String>,
    #[serde(deserialize_with = "lenient::object")]
    thread: Id,
}

/// `{thread: {id}}`: `thread/started`'s params.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ThreadRef {
    #[serde(deserialize_with = "lenient::object")]
    thread: Id,
}

/// `{turn: {id}}`: `turn/start`'s result, `turn/started`'s params.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TurnRef {
    #[serde(deserialize_with = "lenient::object")]
    turn: Id,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ItemParams {
    #[serde(deserialize_with = "lenient::object")]
    item: Item,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Item {
    #[serde(rename = "type", deserialize_with = "lenient::value")]
    kind: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct TokenUsageParams {
    #[serde(deserialize_with = "lenient::value")]
    turn_id: Option<String>,
    #[serde(deserialize_with = "lenient::object")]
    token_usage: TokenUsage,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TokenUsage {
    #[serde(deserialize_with = "lenient::member")]
    total: Option<Breakdown>,
    #[serde(deserialize_with = "lenient::member")]
    last: Option<Breakdown>,
}

/// A `TokenUsageBreakdown`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Breakdown {
    #[serde(deserialize_with = "lenient::count")]
    input_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::count")]
    cached_input_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::count")]
    output_tokens: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct ErrorParams {
    #[serde(deserialize_with = "lenient::value")]
    will_retry: Option<bool>,
    #[serde(deserialize_with = "lenient::member")]
    error: Option<CodexError>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TurnCompleted {
    #[serde(deserialize_with = "lenient::object")]
    turn: CompletedTurn,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct CompletedTurn {
    #[serde(deserialize_with = "lenient::value")]
    id: Option<String>,
    #[serde(deserialize_with = "lenient::value")]
    status: Option<String>,
    #[serde(deserialize_with = "lenient::non_null")]
    error: Option<CodexError>,
}

/// The notifications the adapter reads; every one is forwarded as an
/// event whatever it is.
#[derive(Debug, Deserialize)]
#[serde(tag = "method", content = "params")]
enum Notice {
    #[serde(rename = "thread/started", deserialize_with = "lenient::object")]
    ThreadStarted(ThreadRef),
    #[serde(rename = "turn/started", deserialize_with = "lenient::object")]
    TurnStarted(TurnRef),
    #[serde(
        rename = "item/started",
        alias = "item/completed",
        deserialize_with = "lenient::object"
    )]
    Item(ItemParams),
    #[serde(
        rename = "thread/tokenUsage/updated",
        deserialize_with = "lenient::object"
    )]
    TokenUsage(TokenUsageParams),
    #[serde(rename = "error", deserialize_with = "lenient::object")]
    Error(ErrorParams),
    #[serde(rename = "turn/completed", deserialize_with = "lenient::object")]
    TurnCompleted(TurnCompleted),
    #[serde(other)]
    Other,
}

impl Notice {
    /// Notification `method` with its `params` (`null` when it had none).
    fn read(method: &str, params: &Value) -> Notice {
        lenient::adjacent(("method", method), ("params", params)).unwrap_or(Notice::Other)
    }
}

/// A Codex error `{message, codexErrorInfo?, additionalDetails?}`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct CodexError {
    #[serde(deserialize_with = "lenient::value")]
    message: Option<String>,
    #[serde(deserialize_with = "lenient::value")]
    additional_details: Option<String>,
    #[serde(deserialize_with = "lenient::value")]
    codex_error_info: Option<ErrorInfo>,
}

/// `codexErrorInfo`: a unit variant is a string, a struct variant
/// `{"name": {fields}}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ErrorInfo {
    Unit(String),
    Struct(Map<String, Value>),
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct ErrorInfoFields {
    #[serde(deserialize_with = "lenient::count")]
    http_status_code: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codex_error_info_decides_first() {
        let c = |v: Value| classify_error(&lenient::read(&v)).code;
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
        let e = classify_error(&lenient::read(&json!({
            "message": "Rate limit reached for gpt-5 on tokens per min (TPM). Please try again in 2.4s.",
            "codexErrorInfo": {"httpConnectionFailed": {"httpStatusCode": 429}}})));
        assert_eq!(
            (e.code, e.retry_after_ms),
            (ErrorCode::ProviderRateLimited, Some(2400))
        );
    }

    #[test]
    fn usage_breakdown_separates_cached_input() {
        let u = breakdown(&lenient::read(
            &json!({"inputTokens": 100, "cachedInputTokens": 30, "outputTokens": 7}),
        ));
        assert_eq!(u.input_tokens, Some(70));
        assert_eq!(u.cache_read_tokens, Some(30));
        assert_eq!(u.output_tokens, Some(7));
    }
    #[test]
    fn notices_read_as_the_fake_server_writes_them() {
        let n = |method: &str, params: Value| Notice::read(method, &params);
        assert!(matches!(
            n("thread/started", json!({"thread": {"id": "0199-a"}})),
            Notice::ThreadStarted(ThreadRef { thread: Id { id: Some(id) } }) if id == "0199-a"
        ));
        assert!(matches!(
            n("turn/started", json!({"threadId": "t", "turn": {"id": "turn-1", "status": "inProgress", "items": [], "error": null}})),
            Notice::TurnStarted(TurnRef { turn: Id { id: Some(id) } }) if id == "turn-1"
        ));
        assert!(matches!(
            n("item/completed", json!({"threadId": "t", "turnId": "turn-1",
                "item": {"type": "reasoning", "id": "r_1", "summary": [], "content": []}})),
            Notice::Item(ItemParams { item: Item { kind: Some(k) } }) if k == "reasoning"
        ));
        let Notice::TokenUsage(u) = n(
            "thread/tokenUsage/updated",
            json!({"threadId": "t", "turnId": "turn-1", "tokenUsage": {
                "total": {"inputTokens": 10, "cachedInputTokens": 0, "outputTokens": 5.0},
                "last": {"inputTokens": 4}, "modelContextWindow": 272000}}),
        ) else {
            panic!("not token usage");
        };
        assert_eq!(u.turn_id.as_deref(), Some("turn-1"));
        assert_eq!(u.token_usage.total.map(|t| t.output_tokens), Some(Some(5)));
        let Notice::Error(e) = n(
            "error",
            json!({"threadId": "t", "willRetry": false,
                   "error": {"message": "x", "codexErrorInfo": "unauthorized", "additionalDetails": null}}),
        ) else {
            panic!("not an error");
        };
        assert_eq!(e.will_retry, Some(false));
        assert_eq!(
            e.error.map(|e| classify_error(&e).code),
            Some(ErrorCode::ProviderAuth)
        );
        let Notice::TurnCompleted(c) = n(
            "turn/completed",
            json!({"threadId": "t", "turn": {"id": "turn-1", "status": "failed", "items": [], "error": null}}),
        ) else {
            panic!("not turn/completed");
        };
        assert_eq!(
            (
                c.turn.id.as_deref(),
                c.turn.status.as_deref(),
                c.turn.error.is_none()
            ),
            (Some("turn-1"), Some("failed"), true)
        );
        // Unknown methods, deltas and params of any shape.
        assert!(matches!(
            n("item/agentMessage/delta", json!({"delta": "x"})),
            Notice::Other
        ));
        assert!(matches!(n("hosted_boot.harvest", json!(3)), Notice::Other));
        // Without params (or with params that are no object) a known
        // notice still counts, its members absent.
        assert!(matches!(
            n("item/started", Value::Null),
            Notice::Item(ItemParams {
                item: Item { kind: None }
            })
        ));
        assert!(matches!(
            n("turn/completed", json!([1])),
            Notice::TurnCompleted(TurnCompleted {
                turn: CompletedTurn {
                    id: None,
                    status: None,
                    error: None
                }
            })
        ));
    }

    #[test]
    fn results_read_as_the_fake_server_writes_them() {
        let r: ThreadResult = lenient::read(&json!({
            "thread": {"id": "0199-a", "preview": "", "modelProvider": "openai"},
            "model": "gpt-5-codex", "reasoningEffort": "medium"}));
        assert_eq!(
            (r.model.as_deref(), r.thread.id.as_deref()),
            (Some("gpt-5-codex"), Some("0199-a"))
        );
        let t: TurnRef = lenient::read(&json!({"turn": {"id": "turn-1", "status": "inProgress"}}));
        assert_eq!(t.turn.id.as_deref(), Some("turn-1"));
        assert_eq!(lenient::read::<TurnRef>(&json!({})).turn.id, None);
    }

    #[test]
    fn requests_are_written_as_before() {
        let start = ThreadStart {
            approval_policy: "never",
            cwd: "/r",
            developer_instructions: None,
            exclude_turns: Some(true),
            model: None,
            sandbox: "danger-full-access",
            thread_id: Some("0199-a"),
        };
        assert_eq!(
            serde_json::to_string(&jsonrpc::request(THREAD, "thread/resume", start)).ok(),
            Some(
                json!({"id": THREAD, "method": "thread/resume", "params": {
                    "threadId": "0199-a", "excludeTurns": true, "cwd": "/r",
                    "approvalPolicy": "never", "sandbox": "danger-full-access"}})
                .to_string()
            )
        );
        let turn = TurnStart {
            effort: Some("high"),
            input: [Input {
                text: "p",
                kind: "text",
            }],
            model: None,
            thread_id: "0199-a",
        };
        assert_eq!(
            serde_json::to_string(&turn).ok(),
            Some(
                json!({"threadId": "0199-a", "input": [{"type": "text", "text": "p"}], "effort": "high"})
                    .to_string()
            )
        );
    }
}
