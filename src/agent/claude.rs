//! Claude Code (`--agent claude`): one process per turn,
//!
//! ```text
//! claude -p --output-format stream-json --input-format stream-json --verbose
//!        --permission-mode bypassPermissions [--resume=<id>] [--model=<m>]
//!        [--effort=<e>] [--agent-arg …]
//! ```
//!
//! Stdin is the protocol channel: an `initialize` control request (as the
//! Agent SDKs send first), then the prompt as a stream-json user message;
//! an interrupt is a `control_request {"subtype":"interrupt"}`; stdin is
//! closed after the `result` event (the CLI waits for that EOF to exit).
//! Control requests the CLI sends us (`can_use_tool`, hooks) are answered
//! with an error: the runner registers none.
//!
//! The session id comes from the first event that carries `session_id`
//! (`system/init`); the outcome from `result` (never from its `subtype`
//! alone: an API failure arrives as `success` with `is_error`), its usage
//! from `result.usage` and `total_cost_usd`. Failures are classified from
//! `api_error_status`, the last `rate_limit_event` (a `rejected` one is an
//! exhausted subscription quota), `assistant.error` and the auth source of
//! `system/init`, then from the text.

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::classify::{self, from_http_status};
use super::command::{JsonLines, event_for_line};
use super::lenient;
use super::{
    Adapter, AdapterCommand, AdapterIo, AgentError, Effects, ExitRule, Launch, Note, Observation,
    StdinMode, Terminal, TurnSpec, Usage,
};
use crate::process::supervisor::Stream;
use crate::wire::ErrorCode;

/// The Claude Code adapter for one process.
pub struct ClaudeAdapter {
    spec: TurnSpec,
}

impl ClaudeAdapter {
    /// For one turn.
    pub fn new(spec: TurnSpec) -> Self {
        ClaudeAdapter { spec }
    }
}

/// The arguments for `spec` (after the program).
pub fn args(spec: &TurnSpec) -> Vec<String> {
    let mut args: Vec<String> = [
        "-p",
        "--output-format",
        "stream-json",
        "--input-format",
        "stream-json",
        "--verbose",
        "--permission-mode",
        "bypassPermissions",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Equals form: a value starting with a dash must not read as a flag.
    if let Some(id) = &spec.resume {
        args.push(format!("--resume={id}"));
    }
    if let Some(m) = &spec.model {
        args.push(format!("--model={m}"));
    }
    if let Some(e) = &spec.effort {
        args.push(format!("--effort={e}"));
    }
    // Appended to Claude Code's system prompt, the image's CLAUDE.md and
    // settings untouched.
    if let Some(i) = &spec.instructions {
        args.push(format!("--append-system-prompt-file={}", i.file.display()));
    }
    args.extend(spec.extra_args.iter().cloned());
    args
}

impl Adapter for ClaudeAdapter {
    fn launch(&self) -> Launch {
        Launch {
            args: args(&self.spec),
            env: Vec::new(),
            stdin: StdinMode::Channel,
            protocol_interrupt: true,
            server: false,
            exit_rule: ExitRule::NeedsTerminal,
            stop_signal: rustix::process::Signal::INT,
            wrap_up: true,
        }
    }

    fn run(self: Box<Self>, io: AdapterIo) -> BoxFuture<'static, Observation> {
        run(self.spec, io).boxed()
    }
}

/// What the stream said so far.
#[derive(Debug, Default)]
struct State {
    session_id: Option<String>,
    api_key_source: Option<String>,
    model: Option<String>,
    /// `rate_limit_info` of the last `rate_limit_event`.
    rate_limit: Option<RateLimitInfo>,
    /// `error` of the last `assistant` message that had one.
    assistant_error: Option<String>,
    /// `error_status` of the last `system/api_retry`.
    retry_status: Option<u16>,
    effects: Effects,
    terminal: Option<Terminal>,
    usage: Usage,
    failure: Option<AgentError>,
    interrupts: u32,
    /// Tool calls of the CLI's own (`tool_use`) without their result yet.
    tools_running: usize,
    /// The wrap-up message (issue 38 item 3): asked for and waiting for a
    /// tool call to run, or written. Claude Code 2.1.197 with stream-json
    /// input (real-CLI experiments) folds a user message written while a
    /// tool runs into that tool's result (a `<system-reminder>`), so the
    /// agent reads it within the turn. One it has not taken when the
    /// turn's `result` comes (written while the model answers) would run as
    /// a turn of its own after that result, even once stdin is closed, or
    /// if stopped, stay in the session as an unanswered message that the
    /// next turn resumes. So it is written only while a tool runs (the
    /// model still at work), held until the next tool call otherwise, and
    /// never once the turn's result came; after one was written the turn
    /// still ends at its `result`, and the CLI is stopped then rather than
    /// left to exit on EOF (the message may have missed the tool's result
    /// by milliseconds).
    wrap_up: WrapUp,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum WrapUp {
    #[default]
    NotAsked,
    Held,
    Sent,
}

async fn run(spec: TurnSpec, mut io: AdapterIo) -> Observation {
    let mut state = State::default();
    io.send_json(&json!({
        "type": "control_request",
        "request_id": "hosted-boot-init",
        "request": {"subtype": "initialize", "hooks": null},
    }));
    io.send_json(&user_message(&spec.prompt));
    let mut json_lines = JsonLines::new();
    let mut commands_open = true;
    loop {
        tokio::select! {
            line = io.lines.recv() => {
                let Some((stream, line)) = line else { break };
                io.events
                    .emit_agent(event_for_line(io.events.fresh_redactor(), stream, &line));
                match stream {
                    Stream::Stdout => {
                        if let Some(obj) = json_lines.push(&line) {
                            handle(&spec, &mut state, &mut io, &Value::Object(obj));
                        }
                    }
                    Stream::Stderr => {
                        let text = line.text();
                        if spec.resume.is_some()
                            && state.failure.is_none()
                            && classify::from_text(&text, true) == Some(ErrorCode::ResumeFailed)
                        {
                            state.failure = Some(AgentError::new(ErrorCode::ResumeFailed, classify::clip(&text)));
                        }
                    }
                }
            }
            cmd = io.commands.recv(), if commands_open => match cmd {
                Some(AdapterCommand::ProtocolInterrupt) => {
                    // A wrap-up still held is moot: the turn is stopping.
                    if state.wrap_up == WrapUp::Held {
                        state.wrap_up = WrapUp::NotAsked;
                    }
                    if state.terminal.is_none() {
                        state.interrupts += 1;
                        io.send_json(&json!({
                            "type": "control_request",
                            "request_id": format!("hosted-boot-interrupt-{}", state.interrupts),
                            "request": {"subtype": "interrupt"},
                        }));
                    }
                }
                Some(AdapterCommand::WrapUp) => {
                    if spec.wrap_up.is_some() && state.wrap_up == WrapUp::NotAsked {
                        state.wrap_up = WrapUp::Held;
                        send_wrap_up(&spec, &mut state, &io);
                    }
                }
                None => commands_open = false,
            },
        }
    }
    Observation {
        terminal: state.terminal,
        failure: state.failure,
        usage: state.usage,
        effects: state.effects,
    }
}

/// Writes the wrap-up asked for, if a tool runs and the turn has not ended.
fn send_wrap_up(spec: &TurnSpec, state: &mut State, io: &AdapterIo) {
    if state.wrap_up == WrapUp::Held
        && state.tools_running > 0
        && state.terminal.is_none()
        && let Some(text) = &spec.wrap_up
        && io.send_json(&user_message(text))
    {
        state.wrap_up = WrapUp::Sent;
        io.note(Note::WrapUpSent);
    }
}

/// A stream-json user message of `text`.
fn user_message(text: &str) -> Value {
    json!({
        "type": "user",
        "session_id": "",
        "message": {"role": "user", "content": text},
        "parent_tool_use_id": null,
    })
}

/// Whether `message` is Claude Code refusing the resume it was asked for
/// (or one came after it said so on stderr): its error `result` carries the
/// requested session id, which must not read as the session resumed (a
/// `hosted_boot.agent_session` with `resumed: true` came before the reset,
/// found by a review of issue 39).
fn refused_resume(spec: &TurnSpec, state: &State, message: &Value) -> bool {
    if spec.resume.is_none() {
        return false;
    }
    if state
        .failure
        .as_ref()
        .is_some_and(|f| f.code == ErrorCode::ResumeFailed)
    {
        return true;
    }
    message["type"] == "result"
        && message["is_error"] == true
        && classify::from_text(&message.to_string(), true) == Some(ErrorCode::ResumeFailed)
}

fn handle(spec: &TurnSpec, state: &mut State, io: &mut AdapterIo, message: &Value) {
    if state.session_id.is_none()
        && !refused_resume(spec, state, message)
        && let Some(id) = lenient::read::<SessionRef>(message)
            .session_id
            .filter(|s| !s.is_empty())
    {
        state.session_id = Some(id.clone());
        io.note(Note::SessionId(id));
    }
    match lenient::read(message) {
        Event::System(System::Init(init)) => {
            state.api_key_source = init.api_key_source;
            state.model = init.model;
        }
        Event::System(System::ApiRetry(retry)) => {
            state.retry_status = retry.error_status.and_then(|s| u16::try_from(s).ok());
        }
        Event::Assistant(message) => {
            assistant(state, message);
            send_wrap_up(spec, state, io);
        }
        Event::User(user) => {
            let blocks = user.message.content.unwrap_or_default();
            let results = blocks
                .iter()
                .filter(|block| block.kind.as_deref() == Some("tool_result"))
                .count();
            if results > 0 {
                state.effects = Effects::Some;
                state.tools_running = state.tools_running.saturating_sub(results);
            }
        }
        Event::RateLimitEvent(event) => {
            if let Some(info) = event.rate_limit_info {
                state.rate_limit = Some(info);
            }
        }
        Event::ControlRequest(request) => {
            // The CLI asks us something (a permission, a hook): we registered
            // nothing, so say so rather than leave it waiting.
            if let Some(id) = request.request_id {
                io.send_json(&json!({
                    "type": "control_response",
                    "response": {
                        "subtype": "error",
                        "request_id": id,
                        "error": "hosted-boot answers no control requests",
                    },
                }));
            }
        }
        Event::Result(result) => {
            if state.terminal.is_some() {
                return;
            }
            state.usage = result_usage(&result, state.model.clone());
            state.terminal = Some(terminal(spec, state, &result));
            // The CLI exits once its stdin closes, unless a wrap-up it has
            // not taken yet is queued: then it is stopped now.
            io.note(if state.wrap_up == WrapUp::Sent {
                Note::TerminalStopNow
            } else {
                Note::Terminal
            });
            io.stdin = None;
        }
        Event::System(System::Other) | Event::Other => {}
    }
}

/// An assistant message: its error class, its model, whether it calls a
/// tool (an effect).
fn assistant(state: &mut State, assistant: Assistant) {
    if let Some(e) = assistant.error {
        state.assistant_error = Some(e);
    }
    let message = assistant.message;
    if let Some(m) = message.model
        && m != "<synthetic>"
    {
        state.model = Some(m);
    }
    let blocks = message.content.unwrap_or_default();
    let tool = blocks.iter().any(|block| {
        matches!(
            block.kind.as_deref(),
            Some("tool_use" | "server_tool_use" | "mcp_tool_use")
        )
    });
    if tool {
        state.effects = Effects::Some;
    }
    // Only the CLI's own tools come back as a `tool_result` user message.
    state.tools_running += blocks
        .iter()
        .filter(|block| block.kind.as_deref() == Some("tool_use"))
        .count();
}

fn result_usage(result: &ResultEvent, model: Option<String>) -> Usage {
    let u = &result.usage;
    let model = model.or_else(|| {
        result
            .model_usage
            .as_ref()
            .and_then(|m| m.keys().next().cloned())
    });
    Usage {
        model,
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cache_read_tokens: u.cache_read_input_tokens,
        cache_write_tokens: u.cache_creation_input_tokens,
        cost_usd: result.total_cost_usd,
    }
}

fn terminal(spec: &TurnSpec, state: &State, result: &ResultEvent) -> Terminal {
    let reason = result.terminal_reason.as_deref().unwrap_or("");
    if reason.starts_with("aborted") {
        return Terminal::Aborted;
    }
    let is_error = result.is_error.unwrap_or(false);
    let subtype = result.subtype.as_deref().unwrap_or("");
    if !is_error && subtype == "success" {
        return Terminal::Completed;
    }
    Terminal::Failed(classify_result(spec, state, result))
}

/// Claude's result text: `result`, else the `errors` joined, else the subtype.
fn result_text(result: &ResultEvent) -> String {
    if let Some(t) = result.result.as_deref().filter(|t| !t.is_empty()) {
        return t.to_string();
    }
    let errors: Vec<String> = result
        .errors
        .as_ref()
        .map(|a| {
            a.iter()
                .map(|e| e.as_str().map_or_else(|| e.to_string(), str::to_string))
                .collect()
        })
        .unwrap_or_default();
    if !errors.is_empty() {
        return errors.join("; ");
    }
    format!(
        "the turn ended with {}",
        result.subtype.as_deref().unwrap_or("an error")
    )
}

fn classify_result(spec: &TurnSpec, state: &State, result: &ResultEvent) -> AgentError {
    let text = result_text(result);
    let message = classify::clip(&text);
    let subtype = result.subtype.as_deref().unwrap_or("");
    let reason = result.terminal_reason.as_deref().unwrap_or("");
    let err = |code| AgentError::new(code, message.clone());

    if matches!(subtype, "error_max_turns" | "error_max_budget_usd")
        || matches!(reason, "max_turns" | "budget_exhausted")
    {
        return err(ErrorCode::AgentTimeout);
    }
    if reason == "blocking_limit" {
        return err(ErrorCode::ContextWindowExceeded);
    }
    // An exhausted subscription quota: the one structured signal.
    let limit_status = state.rate_limit.as_ref().and_then(|r| r.status.as_deref());
    if limit_status == Some("rejected") {
        let resets = state.rate_limit.as_ref().and_then(|r| r.resets_at);
        return err(ErrorCode::ProviderQuotaExhausted).resets_at_unix(resets);
    }
    let text_code = classify::from_text(&text, spec.resume.is_some());
    if text_code == Some(ErrorCode::ProviderQuotaExhausted)
        || state.assistant_error.as_deref() == Some("billing_error")
    {
        return err(ErrorCode::ProviderQuotaExhausted)
            .resets_at_unix(classify::claude_reset_epoch(&text));
    }
    if text_code == Some(ErrorCode::ResumeFailed) {
        return err(ErrorCode::ResumeFailed);
    }
    let status = result
        .api_error_status
        .and_then(|s| u16::try_from(s).ok())
        .or(match state.assistant_error.as_deref() {
            Some("rate_limit") => Some(429),
            _ => None,
        })
        .or(state.retry_status.filter(|_| text_code.is_none()));
    match state.assistant_error.as_deref() {
        Some("authentication_failed") => return err(ErrorCode::ProviderAuth),
        // Claude Code 2.1.197 marks a 529 (its retries exhausted) as
        // `server_error` too; the status (or its api_retry notices) says
        // it is an overload, which gets the overload continuation.
        Some("server_error") if status == Some(529) => {
            return err(ErrorCode::ProviderOverloaded);
        }
        Some("server_error") => return err(ErrorCode::ProviderServerError),
        Some("model_not_found") => return err(ErrorCode::InvalidRequest),
        Some("invalid_request") => return err(from_http_status(400, &text)),
        _ => {}
    }
    match status {
        Some(429) => {
            // Under an API key a 429 is a rate limit (API-key quotas show as
            // a credit balance error); under a subscription only a
            // rate_limit_event that still allows requests says so.
            let api_key = matches!(
                state.api_key_source.as_deref(),
                Some("ANTHROPIC_API_KEY" | "apiKeyHelper")
            );
            let allowed = matches!(limit_status, Some("allowed" | "allowed_warning"));
            if api_key || allowed {
                err(ErrorCode::ProviderRateLimited)
            } else {
                err(ErrorCode::ProviderLimitUnknown)
            }
        }
        Some(s) => err(from_http_status(s, &text)),
        None => err(text_code.unwrap_or(ErrorCode::AgentCrashed)),
    }
}

/// The member any message may carry: the session id comes from the first
/// one that has it, whatever its type.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SessionRef {
    #[serde(deserialize_with = "lenient::value")]
    session_id: Option<String>,
}

/// The stream-json messages the adapter reads; every line is forwarded as
/// an event whatever it is.
#[derive(Debug, Default, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event {
    System(System),
    Assistant(Assistant),
    User(User),
    RateLimitEvent(RateLimitEvent),
    ControlRequest(ControlRequest),
    Result(ResultEvent),
    #[default]
    #[serde(other)]
    Other,
}

#[derive(Debug, Default, Deserialize)]
#[serde(tag = "subtype", rename_all = "snake_case")]
enum System {
    Init(Init),
    ApiRetry(ApiRetry),
    #[default]
    #[serde(other)]
    Other,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Init {
    #[serde(deserialize_with = "lenient::value")]
    api_key_source: Option<String>,
    #[serde(deserialize_with = "lenient::value")]
    model: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ApiRetry {
    #[serde(deserialize_with = "lenient::count")]
    error_status: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Assistant {
    #[serde(deserialize_with = "lenient::value")]
    error: Option<String>,
    #[serde(deserialize_with = "lenient::object")]
    message: Message,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct User {
    #[serde(deserialize_with = "lenient::object")]
    message: Message,
}

/// The `message` of an assistant or user message.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Message {
    #[serde(deserialize_with = "lenient::value")]
    model: Option<String>,
    #[serde(deserialize_with = "lenient::list")]
    content: Option<Vec<Block>>,
}

/// A content block.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Block {
    #[serde(rename = "type", deserialize_with = "lenient::value")]
    kind: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RateLimitEvent {
    #[serde(deserialize_with = "lenient::if_object")]
    rate_limit_info: Option<RateLimitInfo>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct RateLimitInfo {
    #[serde(deserialize_with = "lenient::value")]
    status: Option<String>,
    #[serde(deserialize_with = "lenient::value")]
    resets_at: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ControlRequest {
    #[serde(deserialize_with = "lenient::value")]
    request_id: Option<String>,
}

/// The `result` message: the terminal event.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ResultEvent {
    #[serde(deserialize_with = "lenient::value")]
    subtype: Option<String>,
    #[serde(deserialize_with = "lenient::value")]
    is_error: Option<bool>,
    #[serde(deserialize_with = "lenient::value")]
    terminal_reason: Option<String>,
    #[serde(deserialize_with = "lenient::value")]
    result: Option<String>,
    #[serde(deserialize_with = "lenient::value")]
    errors: Option<Vec<Value>>,
    #[serde(deserialize_with = "lenient::count")]
    api_error_status: Option<u64>,
    #[serde(deserialize_with = "lenient::object")]
    usage: ResultUsage,
    #[serde(rename = "modelUsage", deserialize_with = "lenient::value")]
    model_usage: Option<Map<String, Value>>,
    #[serde(deserialize_with = "lenient::value")]
    total_cost_usd: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ResultUsage {
    #[serde(deserialize_with = "lenient::count")]
    input_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::count")]
    output_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::count")]
    cache_read_input_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::count")]
    cache_creation_input_tokens: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::usage::Totals;
    use std::path::PathBuf;

    fn spec(resume: Option<&str>) -> TurnSpec {
        TurnSpec {
            prompt: "p".into(),
            cwd: PathBuf::from("/r"),
            resume: resume.map(str::to_string),
            model: Some("-odd".into()),
            effort: Some("high".into()),
            extra_args: vec!["--max-turns=3".into()],
            opencode_port: None,
            timings: super::super::AgentTimings::default(),
            instructions: None,
            wrap_up: None,
            acp_permissions: Default::default(),
        }
    }

    fn obj(v: Value) -> ResultEvent {
        lenient::read(&v)
    }

    #[test]
    fn the_command_line_keeps_the_prompt_out_of_argv() {
        let a = args(&spec(Some("s-1")));
        assert_eq!(
            a,
            vec![
                "-p",
                "--output-format",
                "stream-json",
                "--input-format",
                "stream-json",
                "--verbose",
                "--permission-mode",
                "bypassPermissions",
                "--resume=s-1",
                "--model=-odd",
                "--effort=high",
                "--max-turns=3"
            ]
        );
    }

    fn classify(state: State, result: Value) -> AgentError {
        match terminal(&spec(None), &state, &obj(result)) {
            Terminal::Failed(e) => e,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn results_are_classified_from_structured_fields_first() {
        let api_error = |status: u16, text: &str| {
            json!({"type": "result", "subtype": "success", "is_error": true,
                   "api_error_status": status, "result": text})
        };
        // A subscription 429 with a rejected rate_limit_event: quota.
        let rejected = State {
            rate_limit: Some(lenient::read(
                &json!({"status": "rejected", "resetsAt": 1700000000}),
            )),
            ..State::default()
        };
        let e = classify(rejected, api_error(429, "API Error: 429 rate_limit_error"));
        assert_eq!(e.code, ErrorCode::ProviderQuotaExhausted);
        assert_eq!(e.resets_at.as_deref(), Some("2023-11-14T22:13:20Z"));
        assert!(!e.retryable);
        // Under an API key a 429 is a rate limit.
        let api_key = State {
            api_key_source: Some("ANTHROPIC_API_KEY".into()),
            ..State::default()
        };
        let e = classify(api_key, api_error(429, "API Error: 429 rate_limit_error"));
        assert_eq!(e.code, ErrorCode::ProviderRateLimited);
        assert!(e.retryable);
        // Under a subscription with no rate_limit_event: unknown, whatever the text.
        let e = classify(
            State::default(),
            api_error(429, "This request would exceed your account's rate limit"),
        );
        assert_eq!(e.code, ErrorCode::ProviderLimitUnknown);
        assert_eq!(
            classify(State::default(), api_error(529, "Overloaded")).code,
            ErrorCode::ProviderOverloaded
        );
        // What Claude Code 2.1.197 prints on a 529: an assistant message
        // marked server_error, then the result with the status.
        let marked = State {
            assistant_error: Some("server_error".into()),
            ..State::default()
        };
        assert_eq!(
            classify(marked, api_error(529, "API Error: 529 Overloaded")).code,
            ErrorCode::ProviderOverloaded
        );
        assert_eq!(
            classify(State::default(), api_error(500, "API Error: 500")).code,
            ErrorCode::ProviderServerError
        );
        let auth = State {
            assistant_error: Some("authentication_failed".into()),
            ..State::default()
        };
        assert_eq!(
            classify(auth, api_error(401, "Invalid API key")).code,
            ErrorCode::ProviderAuth
        );
        assert_eq!(
            classify(State::default(), api_error(400, "Prompt is too long")).code,
            ErrorCode::ContextWindowExceeded
        );
        assert_eq!(
            classify(
                State::default(),
                api_error(
                    400,
                    "Your credit balance is too low to access the Anthropic API."
                )
            )
            .code,
            ErrorCode::ProviderQuotaExhausted
        );
        let older = classify(
            State::default(),
            json!({"type": "result", "subtype": "success", "is_error": true,
                   "result": "Claude AI usage limit reached|1700000000"}),
        );
        assert_eq!(older.code, ErrorCode::ProviderQuotaExhausted);
        assert!(older.resets_at.is_some());
        assert_eq!(
            classify(
                State::default(),
                json!({"type": "result", "subtype": "error_max_turns", "is_error": true})
            )
            .code,
            ErrorCode::AgentTimeout
        );
    }

    #[test]
    fn aborted_and_completed_results() {
        let s = State::default();
        assert_eq!(
            terminal(
                &spec(None),
                &s,
                &obj(
                    json!({"type": "result", "subtype": "success", "is_error": false,
                            "terminal_reason": "aborted_tools"})
                )
            ),
            Terminal::Aborted
        );
        assert_eq!(
            terminal(
                &spec(None),
                &s,
                &obj(json!({"type": "result", "subtype": "success", "is_error": false}))
            ),
            Terminal::Completed
        );
    }

    #[test]
    fn usage_from_the_result() {
        let u = result_usage(
            &obj(json!({"usage": {"input_tokens": 10, "output_tokens": 20,
                                   "cache_read_input_tokens": 30,
                                   "cache_creation_input_tokens": 40},
                        "total_cost_usd": 0.25})),
            Some("claude-sonnet".into()),
        );
        assert_eq!(
            serde_json::to_value(u.reported()).unwrap(),
            json!({"model": "claude-sonnet", "inputTokens": 10, "outputTokens": 20,
                    "cacheReadTokens": 30, "cacheWriteTokens": 40, "costUsd": 0.25})
        );
    }
    #[test]
    fn messages_read_as_the_fake_cli_writes_them() {
        let read = |v: Value| lenient::read::<Event>(&v);
        let init = json!({"type": "system", "subtype": "init", "session_id": "s-1", "cwd": "/r",
            "model": "claude-sonnet", "tools": ["Bash"], "apiKeySource": "none"});
        assert_eq!(
            lenient::read::<SessionRef>(&init).session_id.as_deref(),
            Some("s-1")
        );
        assert!(matches!(
            read(init),
            Event::System(System::Init(Init { api_key_source: Some(a), model: Some(m) }))
                if a == "none" && m == "claude-sonnet"
        ));
        assert!(matches!(
            read(
                json!({"type": "system", "subtype": "api_retry", "attempt": 1,
                        "error_status": 529, "error": "overloaded", "session_id": "s-1"})
            ),
            Event::System(System::ApiRetry(ApiRetry {
                error_status: Some(529)
            }))
        ));
        let Event::Assistant(a) = read(json!({"type": "assistant", "session_id": "s-1",
            "parent_tool_use_id": null, "error": "rate_limit",
            "message": {"id": "msg_1", "model": "claude-sonnet", "role": "assistant",
                "content": [{"type": "text", "text": "x"},
                            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}]}}))
        else {
            panic!("not an assistant message");
        };
        assert_eq!(a.error.as_deref(), Some("rate_limit"));
        assert_eq!(
            a.message
                .content
                .map(|c| c.into_iter().filter_map(|b| b.kind).collect::<Vec<_>>()),
            Some(vec!["text".to_string(), "tool_use".to_string()])
        );
        assert!(matches!(
            read(json!({"type": "user", "session_id": "s-1", "message": {"role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "README.md"}]}})),
            Event::User(User { message: Message { content: Some(c), .. } }) if c.len() == 1
        ));
        let Event::RateLimitEvent(r) =
            read(json!({"type": "rate_limit_event", "session_id": "s-1",
            "rate_limit_info": {"status": "rejected", "resetsAt": 1900000000,
                                "rateLimitType": "five_hour", "utilization": 1.0}}))
        else {
            panic!("not a rate_limit_event");
        };
        let info = r.rate_limit_info.unwrap_or_default();
        assert_eq!(
            (info.status.as_deref(), info.resets_at),
            (Some("rejected"), Some(1_900_000_000.0))
        );
        // An info that is no object leaves the last one in place.
        assert!(matches!(
            read(json!({"type": "rate_limit_event", "rate_limit_info": ["rejected"]})),
            Event::RateLimitEvent(RateLimitEvent {
                rate_limit_info: None
            })
        ));
        assert!(matches!(
            read(json!({"type": "control_request", "request_id": "r1",
                        "request": {"subtype": "can_use_tool"}})),
            Event::ControlRequest(ControlRequest { request_id: Some(id) }) if id == "r1"
        ));
        let Event::Result(r) = read(
            json!({"type": "result", "subtype": "success", "is_error": true,
            "result": "API Error: 529", "session_id": "s-1", "total_cost_usd": 0.0123,
            "usage": {"input_tokens": 100, "output_tokens": 50}, "modelUsage": {"claude-sonnet": {}},
            "terminal_reason": "api_error", "api_error_status": 529}),
        ) else {
            panic!("not a result");
        };
        assert_eq!(
            (r.is_error, r.api_error_status, r.usage.input_tokens),
            (Some(true), Some(529), Some(100))
        );
        assert_eq!(
            result_usage(&r, None).model.as_deref(),
            Some("claude-sonnet")
        );
        // Unknown types and subtypes, a type that is no string, no type.
        for other in [
            json!({"type": "control_response", "response": {"subtype": "success"}}),
            json!({"type": 3, "session_id": "s-1"}),
            json!({"session_id": "s-1"}),
        ] {
            assert!(matches!(read(other), Event::Other));
        }
        assert!(matches!(
            read(json!({"type": "system", "subtype": "compact_boundary"})),
            Event::System(System::Other)
        ));
    }

    /// What the CLI prints, or the runner asks, one step at a time.
    enum Step {
        Out(Value),
        Cmd(AdapterCommand),
    }

    /// What the adapter did over a script.
    struct Driven {
        /// The JSON lines it wrote to stdin.
        written: Vec<Value>,
        /// Whether stdin was still open after the script.
        open: bool,
        notes: Vec<Note>,
        seen: Observation,
    }

    /// The adapter's run over `script` (each step is taken before the
    /// next is given), until the output ends.
    async fn drive(spec: TurnSpec, script: Vec<Step>) -> Driven {
        use crate::events::EventSender;
        use crate::events::spool::Spool;
        use crate::process::lines::Line;
        use crate::process::output::LineReceiver;

        let dir = tempfile::tempdir().unwrap();
        let (spool, _) = Spool::open(dir.path(), crate::redact::Redactor::new()).unwrap();
        let (line_tx, line_rx) = tokio::sync::mpsc::channel(4);
        let (stdin_tx, mut stdin_rx) = tokio::sync::mpsc::unbounded_channel();
        let (cmd_tx, cmd_rx) = tokio::sync::mpsc::unbounded_channel();
        let (note_tx, mut note_rx) = tokio::sync::mpsc::unbounded_channel();
        let io = AdapterIo {
            lines: LineReceiver::new(line_rx),
            stdin: Some(stdin_tx),
            commands: cmd_rx,
            notes: note_tx,
            events: EventSender::detached(spool),
        };
        let task = tokio::spawn(run(spec, io));
        for step in script {
            match step {
                Step::Out(v) => {
                    let line = Line {
                        bytes: v.to_string().into_bytes(),
                        continued: false,
                        redacted_at: None,
                    };
                    line_tx.send((Stream::Stdout, vec![line])).await.unwrap();
                }
                Step::Cmd(c) => cmd_tx.send(c).unwrap(),
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let mut written = Vec::new();
        let open = loop {
            match stdin_rx.try_recv() {
                Ok(bytes) => written.push(serde_json::from_slice(&bytes).unwrap()),
                Err(e) => break e == tokio::sync::mpsc::error::TryRecvError::Empty,
            }
        };
        drop(line_tx);
        let seen = task.await.unwrap();
        let mut notes = Vec::new();
        while let Ok(note) = note_rx.try_recv() {
            notes.push(note);
        }
        Driven {
            written,
            open,
            notes,
            seen,
        }
    }

    fn wrap_up_spec() -> TurnSpec {
        TurnSpec {
            wrap_up: Some("WRAP UP".into()),
            ..spec(None)
        }
    }

    fn result(input: u64) -> Step {
        Step::Out(
            json!({"type": "result", "subtype": "success", "is_error": false,
            "session_id": "s-1", "total_cost_usd": 0.001,
            "usage": {"input_tokens": input, "output_tokens": input / 10}}),
        )
    }

    fn tool_use() -> Step {
        Step::Out(json!({"type": "assistant", "message": {"content": [
            {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "sleep 4"}}]}}))
    }

    fn tool_result() -> Step {
        Step::Out(json!({"type": "user", "message": {"content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": ""}]}}))
    }

    fn init() -> Step {
        Step::Out(json!({"type": "system", "subtype": "init", "session_id": "s-1"}))
    }

    fn users(written: &[Value]) -> Vec<&str> {
        written
            .iter()
            .filter(|v| v["type"] == "user")
            .filter_map(|v| v["message"]["content"].as_str())
            .collect()
    }

    /// Claude Code 2.1.197 folds a message written while a tool runs into
    /// that tool's result: the agent reads it within the turn, whose one
    /// `result` ends it; the CLI is stopped then (a message it has not
    /// taken would run as another turn after that result).
    #[tokio::test]
    async fn a_wrap_up_mid_tool_is_sent_and_the_turn_ends_at_its_result() {
        let d = drive(
            wrap_up_spec(),
            vec![
                init(),
                tool_use(),
                Step::Cmd(AdapterCommand::WrapUp),
                tool_result(),
                result(200),
            ],
        )
        .await;
        assert_eq!(users(&d.written), ["p", "WRAP UP"]);
        assert!(!d.open, "stdin is closed after the result");
        assert_eq!(d.seen.terminal, Some(Terminal::Completed));
        assert_eq!(d.notes[1..], [Note::WrapUpSent, Note::TerminalStopNow]);
    }

    /// A wrap-up asked for while no tool runs (the model is answering) is
    /// held until the next tool call, and written then; one still held when
    /// the turn's result comes is never written (found by reviews: Claude
    /// Code runs a message it has not taken as another turn after the
    /// result, or, stopped, keeps it in the session the next turn resumes).
    #[tokio::test]
    async fn a_wrap_up_waits_for_a_running_tool_and_never_follows_the_result() {
        let d = drive(
            wrap_up_spec(),
            vec![
                init(),
                tool_use(),
                tool_result(),
                Step::Cmd(AdapterCommand::WrapUp),
                tool_use(),
                tool_result(),
                result(200),
            ],
        )
        .await;
        assert_eq!(users(&d.written), ["p", "WRAP UP"]);
        assert_eq!(d.notes[1..], [Note::WrapUpSent, Note::TerminalStopNow]);
        let d = drive(
            wrap_up_spec(),
            vec![
                init(),
                tool_use(),
                tool_result(),
                Step::Cmd(AdapterCommand::WrapUp),
                result(200),
                init(),
                result(100),
            ],
        )
        .await;
        assert_eq!(users(&d.written), ["p"]);
        assert!(!d.open);
        assert_eq!(d.seen.terminal, Some(Terminal::Completed));
        assert_eq!(d.seen.usage.input_tokens, Some(200));
        assert_eq!(d.notes[1..], [Note::Terminal], "{:?}", d.notes);
    }

    /// No wrap-up after the turn's result, and none the boot has no
    /// message for: the CLI then exits on stdin's end as always.
    #[tokio::test]
    async fn no_wrap_up_after_the_result_or_without_a_message() {
        let d = drive(
            wrap_up_spec(),
            vec![init(), result(100), Step::Cmd(AdapterCommand::WrapUp)],
        )
        .await;
        assert_eq!(users(&d.written), ["p"]);
        assert_eq!(d.notes[1..], [Note::Terminal]);
        let d = drive(
            spec(None),
            vec![
                init(),
                tool_use(),
                Step::Cmd(AdapterCommand::WrapUp),
                result(100),
            ],
        )
        .await;
        assert_eq!(users(&d.written), ["p"]);
        assert_eq!(d.seen.terminal, Some(Terminal::Completed));
        assert_eq!(d.notes[1..], [Note::Terminal]);
    }
}
