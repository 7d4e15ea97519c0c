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
use serde_json::{Map, Value};

use super::classify;
use super::codex::classify_error;
use super::command::{JsonLines, event_for_line};
use super::usage::Totals;
use super::usage::as_u64;
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
                    handle(&mut state, &io, &obj);
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

fn handle(state: &mut State, io: &AdapterIo, obj: &Map<String, Value>) {
    let kind = obj.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "thread.started" => {
            if let Some(id) = obj.get("thread_id").and_then(Value::as_str)
                && state.thread_id.is_none()
            {
                state.thread_id = Some(id.to_string());
                io.note(Note::SessionId(id.to_string()));
            }
        }
        "item.started" | "item.updated" | "item.completed" => {
            let item_type = obj
                .get("item")
                .and_then(|i| i.get("type"))
                .and_then(Value::as_str)
                .unwrap_or("");
            if !TALK_ITEMS.contains(&item_type) {
                state.effects = Effects::Some;
            }
        }
        "turn.completed" => {
            let u = obj.get("usage");
            let input = as_u64(u.and_then(|u| u.get("input_tokens")));
            let cached = as_u64(u.and_then(|u| u.get("cached_input_tokens")));
            state.total = Some(Usage {
                model: None,
                input_tokens: input.map(|i| i.saturating_sub(cached.unwrap_or(0))),
                output_tokens: as_u64(u.and_then(|u| u.get("output_tokens"))),
                cache_read_tokens: cached,
                cache_write_tokens: None,
                cost_usd: None,
            });
            state.terminal = Some(Terminal::Completed);
            io.note(Note::Terminal);
        }
        "turn.failed" => {
            let error = obj.get("error").cloned().unwrap_or(Value::Null);
            state.terminal = Some(Terminal::Failed(classify_error(&super::lenient::read(
                &error,
            ))));
            io.note(Note::Terminal);
        }
        "error" => {
            state.last_error = obj
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_string);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
}
