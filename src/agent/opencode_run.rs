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
use serde::Deserialize;
use serde_json::Value;

use super::classify;
use super::command::{JsonLines, event_for_line};
use super::lenient;
use super::opencode::{OpenCodeError, Part, classify_error, record_step};
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
            wrap_up: false,
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
                    handle(resuming, &mut state, &io, &Value::Object(obj));
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

fn handle(resuming: bool, state: &mut State, io: &AdapterIo, message: &Value) {
    if state.session.is_none()
        && let Some(id) = lenient::read::<SessionRef>(message).session_id
    {
        state.session = Some(id.clone());
        io.note(Note::SessionId(id));
    }
    match lenient::read(message) {
        Event::ToolUse => state.effects = Effects::Some,
        Event::StepFinish(StepFinish { part: Some(part) }) => record_step(&mut state.steps, &part),
        Event::Error(ErrorEvent { error: Some(error) }) => match classify_error(&error, resuming) {
            None => state.aborted = true,
            Some(e) => {
                if state.error.is_none() {
                    state.error = Some(e);
                }
            }
        },
        Event::Done if state.terminal.is_none() => {
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

/// The member every event carries: the session id comes from the first
/// one that has it, whatever its type.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SessionRef {
    #[serde(rename = "sessionID", deserialize_with = "lenient::value")]
    session_id: Option<String>,
}

/// The `--format json` events the adapter reads; every line is forwarded
/// as an event whatever it is.
#[derive(Debug, Default, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event {
    ToolUse,
    StepFinish(StepFinish),
    Error(ErrorEvent),
    Done,
    #[default]
    #[serde(other)]
    Other,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StepFinish {
    #[serde(deserialize_with = "lenient::member")]
    part: Option<Part>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ErrorEvent {
    #[serde(deserialize_with = "lenient::member")]
    error: Option<OpenCodeError>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
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
            wrap_up: None,
            acp_permissions: Default::default(),
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
    #[test]
    fn events_read_as_opencode_run_writes_them() {
        let read = |v: Value| lenient::read::<Event>(&v);
        assert_eq!(
            lenient::read::<SessionRef>(
                &json!({"type": "step_start", "sessionID": "ses_1", "part": {}})
            )
            .session_id
            .as_deref(),
            Some("ses_1")
        );
        assert!(matches!(
            read(
                json!({"type": "tool_use", "sessionID": "ses_1", "part": {"type": "tool", "tool": "bash"}})
            ),
            Event::ToolUse
        ));
        let Event::StepFinish(StepFinish { part: Some(part) }) =
            read(json!({"type": "step_finish",
            "sessionID": "ses_1", "part": {"id": "prt_1", "type": "step-finish", "reason": "stop",
            "cost": 0.01, "tokens": {"input": 10, "output": 5, "reasoning": 0,
            "cache": {"read": 0, "write": 0}}}}))
        else {
            panic!("not a step_finish");
        };
        let mut steps = Vec::new();
        record_step(&mut steps, &part);
        assert_eq!(steps[0].0, "prt_1");
        assert_eq!(steps[0].1.input_tokens, Some(10));
        let Event::Error(ErrorEvent { error: Some(error) }) = read(json!({"type": "error",
            "sessionID": "ses_1", "error": {"name": "APIError",
            "data": {"message": "", "statusCode": 429}}}))
        else {
            panic!("not an error");
        };
        assert_eq!(
            classify_error(&error, false).map(|e| e.code),
            Some(ErrorCode::ProviderLimitUnknown)
        );
        assert!(matches!(
            read(json!({"type": "done", "sessionID": "ses_1"})),
            Event::Done
        ));
        // A null part still counts as a step (with no usage); an unknown
        // type, a type that is no string and no type are ignored.
        assert!(matches!(
            read(json!({"type": "step_finish", "part": null})),
            Event::StepFinish(StepFinish { part: Some(_) })
        ));
        for other in [
            json!({"type": "text", "sessionID": "ses_1", "part": {"text": "hi"}}),
            json!({"type": ["done"]}),
            json!({"sessionID": "ses_1"}),
        ] {
            assert!(matches!(read(other), Event::Other));
        }
    }
}
