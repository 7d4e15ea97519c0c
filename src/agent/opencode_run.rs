//! opencode fallback (`--agent opencode-run`): one `opencode run` per turn,
//!
//! ```text
//! opencode run --format json --auto [--session <ses_…>] [-m <provider/model>]
//!              [--variant <effort>] [--agent-arg …]
//! ```
//!
//! The prompt is stdin (read to EOF, then closed). Events are the JSON lines
//! of `--format json` (`step_start`, `text`, `reasoning`, `tool_use`,
//! `step_finish`, `error`, `done`), each with the `sessionID`. There is no
//! protocol interrupt and no retry notice (`run` hides them); a clean exit
//! without an `error` event is a completed turn (older builds have no
//! `done`). Errors are opencode's `{name, data}` ([`super::opencode`]).

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use serde_json::{Map, Value};

use super::classify;
use super::command::{JsonLines, event_for_line};
use super::opencode::{classify_error, step_usage};
use super::usage::Totals;
use super::{
    Adapter, AdapterIo, AgentError, Effects, ExitRule, Launch, Note, Observation, StdinMode,
    Terminal, TurnSpec, Usage,
};
use crate::process::supervisor::Stream;
use crate::wire::ErrorCode;

/// The `opencode run` adapter for one process.
pub struct OpenCodeRunAdapter {
    spec: TurnSpec,
}

impl OpenCodeRunAdapter {
    /// For one turn.
    pub fn new(spec: TurnSpec) -> Self {
        OpenCodeRunAdapter { spec }
    }
}

/// The arguments for `spec` (after the program).
pub fn args(spec: &TurnSpec) -> Vec<String> {
    let mut args: Vec<String> = ["run", "--format", "json", "--auto"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if let Some(id) = &spec.resume {
        args.push("--session".into());
        args.push(id.clone());
    }
    if let Some(m) = &spec.model {
        args.push("-m".into());
        args.push(m.clone());
    }
    if let Some(e) = &spec.effort {
        args.push("--variant".into());
        args.push(e.clone());
    }
    args.extend(spec.extra_args.iter().cloned());
    args
}

/// opencode's inline configuration variable.
pub const CONFIG_CONTENT_VAR: &str = "OPENCODE_CONFIG_CONTENT";

/// `OPENCODE_CONFIG_CONTENT` naming the instructions file (`opencode run`
/// has no flag for instructions).
fn instructions_env(spec: &TurnSpec) -> Vec<(String, crate::secret::Secret)> {
    spec.instructions
        .iter()
        .map(|i| {
            let content = serde_json::json!({"instructions": [i.file.to_string_lossy()]});
            (
                CONFIG_CONTENT_VAR.to_string(),
                crate::secret::Secret::new(content.to_string()),
            )
        })
        .collect()
}

/// `ours` (a JSON object) merged into the image's `OPENCODE_CONFIG_CONTENT`:
/// its members kept, `instructions` lists joined. An image value that is
/// not a JSON object (which opencode refuses) gives way to ours.
pub fn merge_config_content(image: &str, ours: &str) -> String {
    let (Ok(serde_json::Value::Object(mut merged)), Ok(serde_json::Value::Object(add))) = (
        serde_json::from_str::<serde_json::Value>(image),
        serde_json::from_str::<serde_json::Value>(ours),
    ) else {
        return ours.to_string();
    };
    for (key, value) in add {
        match (merged.get_mut(&key), value) {
            (Some(serde_json::Value::Array(have)), serde_json::Value::Array(more)) => {
                have.extend(more)
            }
            (_, value) => {
                merged.insert(key, value);
            }
        }
    }
    serde_json::Value::Object(merged).to_string()
}

impl Adapter for OpenCodeRunAdapter {
    fn launch(&self) -> Launch {
        Launch {
            args: args(&self.spec),
            env: instructions_env(&self.spec),
            stdin: StdinMode::Bytes(self.spec.prompt.clone().into_bytes()),
            protocol_interrupt: false,
            server: false,
            exit_rule: ExitRule::ZeroSucceeds,
            stop_signal: rustix::process::Signal::TERM,
        }
    }

    fn run(self: Box<Self>, io: AdapterIo) -> BoxFuture<'static, Observation> {
        run(self.spec, io).boxed()
    }
}

#[derive(Debug, Default)]
struct State {
    session: Option<String>,
    effects: Effects,
    terminal: Option<Terminal>,
    error: Option<AgentError>,
    aborted: bool,
    steps: Vec<(String, Usage)>,
}

async fn run(spec: TurnSpec, mut io: AdapterIo) -> Observation {
    let resuming = spec.resume.is_some();
    let mut state = State::default();
    let mut json_lines = JsonLines::new();
    while let Some((stream, line)) = io.lines.recv().await {
        io.events
            .emit_agent(event_for_line(io.events.fresh_redactor(), stream, &line));
        match stream {
            Stream::Stdout => {
                if let Some(obj) = json_lines.push(&line) {
                    handle(resuming, &mut state, &io, &obj);
                }
            }
            Stream::Stderr => {
                let text = line.text();
                if resuming
                    && state.error.is_none()
                    && classify::from_text(&text, true) == Some(ErrorCode::ResumeFailed)
                {
                    state.error = Some(AgentError::new(
                        ErrorCode::ResumeFailed,
                        classify::clip(&text),
                    ));
                }
            }
        }
    }
    let mut usage = Usage {
        model: spec.model.clone(),
        ..Usage::default()
    };
    for (_, step) in &state.steps {
        usage.add(step);
    }
    Observation {
        terminal: state.terminal,
        failure: state.error,
        usage,
        effects: state.effects,
    }
}

fn handle(resuming: bool, state: &mut State, io: &AdapterIo, obj: &Map<String, Value>) {
    if state.session.is_none()
        && let Some(id) = obj.get("sessionID").and_then(Value::as_str)
    {
        state.session = Some(id.to_string());
        io.note(Note::SessionId(id.to_string()));
    }
    match obj.get("type").and_then(Value::as_str).unwrap_or("") {
        "tool_use" => state.effects = Effects::Some,
        "step_finish" => {
            if let Some(part) = obj.get("part") {
                let id = part
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let usage = step_usage(part);
                match state.steps.iter_mut().find(|(i, _)| *i == id) {
                    Some(slot) => slot.1 = usage,
                    None => state.steps.push((id, usage)),
                }
            }
        }
        "error" => {
            if let Some(error) = obj.get("error") {
                match classify_error(error, resuming) {
                    None => state.aborted = true,
                    Some(e) => {
                        if state.error.is_none() {
                            state.error = Some(e);
                        }
                    }
                }
            }
        }
        "done" if state.terminal.is_none() => {
            state.terminal = Some(match (&state.error, state.aborted) {
                (_, true) => Terminal::Aborted,
                (Some(e), false) => Terminal::Failed(e.clone()),
                (None, false) => Terminal::Completed,
            });
            io.note(Note::Terminal);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn command_line() {
        let spec = TurnSpec {
            prompt: "p".into(),
            cwd: PathBuf::from("/r"),
            resume: Some("ses_1".into()),
            model: Some("anthropic/claude".into()),
            effort: Some("high".into()),
            extra_args: vec!["--agent".into(), "build".into()],
            opencode_port: None,
            timings: super::super::AgentTimings::default(),
            instructions: None,
        };
        assert_eq!(
            args(&spec),
            vec![
                "run",
                "--format",
                "json",
                "--auto",
                "--session",
                "ses_1",
                "-m",
                "anthropic/claude",
                "--variant",
                "high",
                "--agent",
                "build"
            ]
        );
    }
}
