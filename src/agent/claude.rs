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
use serde_json::{Map, Value, json};

use super::classify::{self, from_http_status};
use super::command::{JsonLines, event_for_line};
use super::usage::as_u64;
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
    rate_limit: Option<Map<String, Value>>,
    /// `error` of the last `assistant` message that had one.
    assistant_error: Option<String>,
    /// `error_status` of the last `system/api_retry`.
    retry_status: Option<u16>,
    effects: Effects,
    terminal: Option<Terminal>,
    usage: Usage,
    failure: Option<AgentError>,
    interrupts: u32,
}

async fn run(spec: TurnSpec, mut io: AdapterIo) -> Observation {
    let mut state = State::default();
    io.send_json(&json!({
        "type": "control_request",
        "request_id": "hosted-boot-init",
        "request": {"subtype": "initialize", "hooks": null},
    }));
    io.send_json(&json!({
        "type": "user",
        "session_id": "",
        "message": {"role": "user", "content": spec.prompt},
        "parent_tool_use_id": null,
    }));
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
                            handle(&spec, &mut state, &mut io, &obj);
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
                    if state.terminal.is_none() {
                        state.interrupts += 1;
                        io.send_json(&json!({
                            "type": "control_request",
                            "request_id": format!("hosted-boot-interrupt-{}", state.interrupts),
                            "request": {"subtype": "interrupt"},
                        }));
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

fn str_field<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    obj.get(key).and_then(Value::as_str)
}

fn handle(spec: &TurnSpec, state: &mut State, io: &mut AdapterIo, obj: &Map<String, Value>) {
    if state.session_id.is_none()
        && let Some(id) = str_field(obj, "session_id").filter(|s| !s.is_empty())
    {
        state.session_id = Some(id.to_string());
        io.note(Note::SessionId(id.to_string()));
    }
    match str_field(obj, "type").unwrap_or("") {
        "system" => match str_field(obj, "subtype").unwrap_or("") {
            "init" => {
                state.api_key_source = str_field(obj, "apiKeySource").map(str::to_string);
                state.model = str_field(obj, "model").map(str::to_string);
            }
            "api_retry" => {
                state.retry_status =
                    as_u64(obj.get("error_status")).and_then(|s| u16::try_from(s).ok());
            }
            _ => {}
        },
        "assistant" => assistant(state, obj),
        "user" => {
            let blocks = obj
                .get("message")
                .and_then(|m| m.get("content"))
                .and_then(Value::as_array);
            if blocks.is_some_and(|b| {
                b.iter()
                    .any(|block| block.get("type").and_then(Value::as_str) == Some("tool_result"))
            }) {
                state.effects = Effects::Some;
            }
        }
        "rate_limit_event" => {
            if let Some(Value::Object(info)) = obj.get("rate_limit_info") {
                state.rate_limit = Some(info.clone());
            }
        }
        "control_request" => {
            // The CLI asks us something (a permission, a hook): we registered
            // nothing, so say so rather than leave it waiting.
            if let Some(id) = str_field(obj, "request_id") {
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
        "result" => {
            if state.terminal.is_some() {
                return;
            }
            state.usage = result_usage(obj, state.model.clone());
            state.terminal = Some(terminal(spec, state, obj));
            io.note(Note::Terminal);
            // The CLI exits once its stdin closes.
            io.stdin = None;
        }
        _ => {}
    }
}

/// An assistant message: its error class, its model, whether it calls a
/// tool (an effect).
fn assistant(state: &mut State, obj: &Map<String, Value>) {
    if let Some(e) = str_field(obj, "error") {
        state.assistant_error = Some(e.to_string());
    }
    let message = obj.get("message");
    if let Some(m) = message.and_then(|m| m.get("model")).and_then(Value::as_str)
        && m != "<synthetic>"
    {
        state.model = Some(m.to_string());
    }
    let blocks = message
        .and_then(|m| m.get("content"))
        .and_then(Value::as_array);
    let tool = blocks.is_some_and(|b| {
        b.iter().any(|block| {
            matches!(
                block.get("type").and_then(Value::as_str),
                Some("tool_use" | "server_tool_use" | "mcp_tool_use")
            )
        })
    });
    if tool {
        state.effects = Effects::Some;
    }
}

fn result_usage(obj: &Map<String, Value>, model: Option<String>) -> Usage {
    let u = obj.get("usage");
    let field = |k: &str| as_u64(u.and_then(|u| u.get(k)));
    let model = model.or_else(|| {
        obj.get("modelUsage")
            .and_then(Value::as_object)
            .and_then(|m| m.keys().next().cloned())
    });
    Usage {
        model,
        input_tokens: field("input_tokens"),
        output_tokens: field("output_tokens"),
        cache_read_tokens: field("cache_read_input_tokens"),
        cache_write_tokens: field("cache_creation_input_tokens"),
        cost_usd: obj.get("total_cost_usd").and_then(Value::as_f64),
    }
}

fn terminal(spec: &TurnSpec, state: &State, obj: &Map<String, Value>) -> Terminal {
    let reason = str_field(obj, "terminal_reason").unwrap_or("");
    if reason.starts_with("aborted") {
        return Terminal::Aborted;
    }
    let is_error = obj
        .get("is_error")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let subtype = str_field(obj, "subtype").unwrap_or("");
    if !is_error && subtype == "success" {
        return Terminal::Completed;
    }
    Terminal::Failed(classify_result(spec, state, obj))
}

/// Claude's result text: `result`, else the `errors` joined, else the subtype.
fn result_text(obj: &Map<String, Value>) -> String {
    if let Some(t) = str_field(obj, "result").filter(|t| !t.is_empty()) {
        return t.to_string();
    }
    let errors: Vec<String> = obj
        .get("errors")
        .and_then(Value::as_array)
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
        str_field(obj, "subtype").unwrap_or("an error")
    )
}

fn classify_result(spec: &TurnSpec, state: &State, obj: &Map<String, Value>) -> AgentError {
    let text = result_text(obj);
    let message = classify::clip(&text);
    let subtype = str_field(obj, "subtype").unwrap_or("");
    let reason = str_field(obj, "terminal_reason").unwrap_or("");
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
    let limit_status = state
        .rate_limit
        .as_ref()
        .and_then(|r| r.get("status"))
        .and_then(Value::as_str);
    if limit_status == Some("rejected") {
        let resets = state
            .rate_limit
            .as_ref()
            .and_then(|r| r.get("resetsAt"))
            .and_then(Value::as_f64);
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
    let status = as_u64(obj.get("api_error_status"))
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
        }
    }

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("not an object"),
        }
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
            rate_limit: Some(obj(json!({"status": "rejected", "resetsAt": 1700000000}))),
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
}
