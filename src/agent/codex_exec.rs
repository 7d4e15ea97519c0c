//! Codex fallback (`--agent codex-exec`): one `codex exec` per turn,
//!
//! ```text
//! codex exec --json --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox
//!            [-m <model>] [-c model_reasoning_effort="<e>"] [--agent-arg …]
//!            [resume <thread-id>] -
//! ```
//!
//! Every flag comes before `resume` (flags after it are refused), the
//! prompt is read from stdin (`-`), which is then closed. Events are the
//! JSONL of `exec --json` (`thread.started`, `item.*`, `turn.completed`,
//! `turn.failed`, `error`). There is no protocol interrupt: `codex exec`
//! handles the runner's SIGINT itself (it interrupts the turn, then exits).
//! Errors carry only a message (`codexErrorInfo` is lost), so they are
//! classified from text. `turn.completed.usage` is the thread's running
//! total: the turn's own usage is the difference from the total this boot
//! last saw for that thread; for a thread resumed from an earlier boot, or
//! after a turn that printed no total (interrupted), the token counts are
//! left out (the baseline is unknown).

use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use serde::Deserialize;
use serde_json::Value;

use super::classify;
use super::codex::{CodexError, classify_error};
use super::command::{JsonLines, event_for_line};
use super::lenient;
use super::usage::Totals;
use super::{
    Adapter, AdapterIo, AgentError, AgentSession, Effects, ExitRule, Launch, Note, Observation,
    StdinMode, Terminal, TurnSpec, Usage,
};
use crate::process::supervisor::Stream;
use crate::wire::ErrorCode;

/// The `codex exec` adapter for one process.
pub struct CodexExecAdapter {
    spec: TurnSpec,
    session: Arc<AgentSession>,
}

impl CodexExecAdapter {
    /// For one turn; `session` keeps the thread's running token total.
    pub fn new(spec: TurnSpec, session: Arc<AgentSession>) -> Self {
        CodexExecAdapter { spec, session }
    }
}

/// The arguments for `spec` (after the program).
pub fn args(spec: &TurnSpec) -> Vec<String> {
    let mut args: Vec<String> = [
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(m) = &spec.model {
        args.push("-m".into());
        args.push(m.clone());
    }
    if let Some(e) = &spec.effort {
        args.push("-c".into());
        args.push(format!("model_reasoning_effort={}", toml_string(e)));
    }
    // A config override of this invocation: the image's config.toml and
    // AGENTS.md untouched.
    if let Some(i) = &spec.instructions {
        args.push("-c".into());
        args.push(format!("developer_instructions={}", toml_string(&i.text)));
    }
    args.extend(spec.extra_args.iter().cloned());
    if let Some(id) = &spec.resume {
        args.push("resume".into());
        args.push(id.clone());
    }
    args.push("-".into());
    args
}

/// A TOML basic string (the `-c` values are TOML).
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl Adapter for CodexExecAdapter {
    fn launch(&self) -> Launch {
        Launch {
            args: args(&self.spec),
            env: Vec::new(),
            stdin: StdinMode::Bytes(self.spec.prompt.clone().into_bytes()),
            protocol_interrupt: false,
            server: false,
            exit_rule: ExitRule::NeedsTerminal,
            stop_signal: rustix::process::Signal::INT,
            wrap_up: false,
        }
    }

    fn run(self: Box<Self>, io: AdapterIo) -> BoxFuture<'static, Observation> {
        run(self.spec, self.session, io).boxed()
    }
}

#[derive(Debug, Default)]
struct State {
    thread_id: Option<String>,
    effects: Effects,
    terminal: Option<Terminal>,
    total: Option<Usage>,
    last_error: Option<String>,
}

/// Item types that are only talk.
const TALK_ITEMS: &[&str] = &["agent_message", "reasoning", "todo_list", "error", "plan"];

async fn run(spec: TurnSpec, session: Arc<AgentSession>, mut io: AdapterIo) -> Observation {
    let mut state = State::default();
    let mut json_lines = JsonLines::new();
    let mut stderr = String::new();
    while let Some((stream, line)) = io.lines.recv().await {
        io.events
            .emit_agent(event_for_line(io.events.fresh_redactor(), stream, &line));
        match stream {
            Stream::Stdout => {
                if let Some(obj) = json_lines.push(&line) {
                    handle(&mut state, &io, &Value::Object(obj));
                }
            }
            Stream::Stderr => {
                if stderr.len() < 64 * 1024 {
                    stderr.push_str(&line.text());
                    stderr.push('\n');
                }
            }
        }
    }
    let mut usage = Usage {
        model: spec.model.clone(),
        ..Usage::default()
    };
    if let (Some(total), Some(thread)) = (&state.total, &state.thread_id) {
        let earlier = session.cumulative_for(thread);
        let own = match (&earlier, &spec.resume) {
            (Some(before), _) => Some(total.minus(before)),
            (None, None) => Some(total.clone()),
            (None, Some(_)) => {
                tracing::info!(
                    thread = %thread,
                    "codex exec reports the thread's running token total and this boot has not seen the thread before; the turn's token counts are left out"
                );
                None
            }
        };
        session.set_cumulative(thread.clone(), total.clone());
        if let Some(own) = own {
            usage.add(&own);
        }
    } else {
        // No total (an interrupted turn prints no `turn.completed`): this
        // turn reports no tokens, and the next one's total would include
        // them, so the next one's are left out too.
        session.forget_cumulative();
    }
    let resuming = spec.resume.is_some();
    let failure = if state.terminal.is_none() {
        let from_stderr = classify::from_text(&stderr, resuming)
            .filter(|c| *c == ErrorCode::ResumeFailed)
            .map(|c| AgentError::new(c, classify::clip(&stderr)));
        from_stderr.or_else(|| {
            state
                .last_error
                .as_deref()
                .and_then(|t| classify::text_error(t, resuming))
        })
    } else {
        None
    };
    Observation {
        terminal: state.terminal,
        failure,
        usage,
        effects: state.effects,
    }
}

fn handle(state: &mut State, io: &AdapterIo, message: &Value) {
    match lenient::read(message) {
        Event::ThreadStarted(ThreadStarted { thread_id }) => {
            if let Some(id) = thread_id
                && state.thread_id.is_none()
            {
                state.thread_id = Some(id.clone());
                io.note(Note::SessionId(id));
            }
        }
        Event::Item(ItemEvent { item }) => {
            let item_type = item.kind.as_deref().unwrap_or("");
            if !TALK_ITEMS.contains(&item_type) {
                state.effects = Effects::Some;
            }
        }
        Event::TurnCompleted(TurnCompleted { usage: u }) => {
            state.total = Some(Usage {
                model: None,
                input_tokens: u
                    .input_tokens
                    .map(|i| i.saturating_sub(u.cached_input_tokens.unwrap_or(0))),
                output_tokens: u.output_tokens,
                cache_read_tokens: u.cached_input_tokens,
                cache_write_tokens: None,
                cost_usd: None,
            });
            state.terminal = Some(Terminal::Completed);
            io.note(Note::Terminal);
        }
        Event::TurnFailed(TurnFailed { error }) => {
            state.terminal = Some(Terminal::Failed(classify_error(&error)));
            io.note(Note::Terminal);
        }
        Event::Error(ErrorEvent { message }) => state.last_error = message,
        Event::Other => {}
    }
}

/// The `exec --json` events the adapter reads; every line is forwarded as
/// an event whatever it is.
#[derive(Debug, Default, Deserialize)]
#[serde(tag = "type")]
enum Event {
    #[serde(rename = "thread.started")]
    ThreadStarted(ThreadStarted),
    #[serde(
        rename = "item.started",
        alias = "item.updated",
        alias = "item.completed"
    )]
    Item(ItemEvent),
    #[serde(rename = "turn.completed")]
    TurnCompleted(TurnCompleted),
    #[serde(rename = "turn.failed")]
    TurnFailed(TurnFailed),
    #[serde(rename = "error")]
    Error(ErrorEvent),
    #[default]
    #[serde(other)]
    Other,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ThreadStarted {
    #[serde(deserialize_with = "lenient::value")]
    thread_id: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ItemEvent {
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
#[serde(default)]
struct TurnCompleted {
    #[serde(deserialize_with = "lenient::object")]
    usage: TurnUsage,
}

/// The thread's running total (`input_tokens` includes the cached part).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TurnUsage {
    #[serde(deserialize_with = "lenient::count")]
    input_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::count")]
    cached_input_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::count")]
    output_tokens: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TurnFailed {
    #[serde(deserialize_with = "lenient::object")]
    error: CodexError,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ErrorEvent {
    #[serde(deserialize_with = "lenient::value")]
    message: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::path::PathBuf;

    #[test]
    fn every_flag_comes_before_resume_and_the_prompt_is_stdin() {
        let spec = TurnSpec {
            prompt: "p".into(),
            cwd: PathBuf::from("/r"),
            resume: Some("0199-thread".into()),
            model: Some("gpt-5".into()),
            effort: Some("high".into()),
            extra_args: vec!["-c".into(), "x=1".into()],
            opencode_port: None,
            timings: super::super::AgentTimings::default(),
            instructions: None,
            wrap_up: None,
            acp_permissions: Default::default(),
        };
        assert_eq!(
            args(&spec),
            vec![
                "exec",
                "--json",
                "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox",
                "-m",
                "gpt-5",
                "-c",
                "model_reasoning_effort=\"high\"",
                "-c",
                "x=1",
                "resume",
                "0199-thread",
                "-"
            ]
        );
        assert_eq!(toml_string("a\"b"), "\"a\\\"b\"");
    }
    #[test]
    fn events_read_as_codex_exec_writes_them() {
        let read = |v: Value| lenient::read::<Event>(&v);
        assert!(matches!(
            read(json!({"type": "thread.started", "thread_id": "0199-a"})),
            Event::ThreadStarted(ThreadStarted { thread_id: Some(id) }) if id == "0199-a"
        ));
        for kind in ["item.started", "item.updated", "item.completed"] {
            assert!(matches!(
                read(json!({"type": kind, "item": {"id": "item_0", "type": "command_execution", "command": "ls"}})),
                Event::Item(ItemEvent { item: Item { kind: Some(k) } }) if k == "command_execution"
            ));
        }
        let Event::TurnCompleted(TurnCompleted { usage }) = read(json!({"type": "turn.completed",
            "usage": {"input_tokens": 100, "cached_input_tokens": 30, "output_tokens": 7}}))
        else {
            panic!("not turn.completed");
        };
        assert_eq!(
            (
                usage.input_tokens,
                usage.cached_input_tokens,
                usage.output_tokens
            ),
            (Some(100), Some(30), Some(7))
        );
        let Event::TurnFailed(TurnFailed { error }) = read(json!({"type": "turn.failed",
            "error": {"message": "You've hit your usage limit."}}))
        else {
            panic!("not turn.failed");
        };
        assert_eq!(
            classify_error(&error).code,
            ErrorCode::ProviderQuotaExhausted
        );
        assert!(matches!(
            read(json!({"type": "error", "message": "Reconnecting... 1/5"})),
            Event::Error(ErrorEvent { message: Some(m) }) if m == "Reconnecting... 1/5"
        ));
        // turn.failed without an error still fails the turn.
        assert!(matches!(
            read(json!({"type": "turn.failed"})),
            Event::TurnFailed(_)
        ));
        for other in [
            json!({"type": "turn.started"}),
            json!({"type": 1}),
            json!({"thread_id": "0199-a"}),
        ] {
            assert!(matches!(read(other), Event::Other));
        }
    }
}
