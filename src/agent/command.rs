//! The `command` agent: any program. The prompt goes on stdin (then EOF),
//! each stdout line that is a JSON object with a string `type` becomes an
//! event of that type, any other line an `output` event, stderr lines
//! `stderr` events (PROTOCOL.md 4.6 for `hosted_boot.` types).

use std::os::unix::process::ExitStatusExt;

use serde_json::{Value, json};

use super::TurnOutcome;
use crate::turn::events::text_data;
use crate::turn::lines::Line;
use crate::turn::supervisor::{Exit, Stream};
use crate::wire::{ErrorCode, RunOutcome};

/// Prefix reserved for the runner's own events.
pub const RUNNER_EVENT_PREFIX: &str = "hosted_boot.";

/// Maps one output line to `(type, data)`.
pub fn event_for_line(stream: Stream, line: &Line) -> (String, Value) {
    let text = line.text();
    match stream {
        Stream::Stderr => ("stderr".to_string(), text_data(text, line.continued)),
        Stream::Stdout => {
            if !line.continued
                && let Ok(Value::Object(map)) = serde_json::from_str::<Value>(&text)
                && let Some(Value::String(kind)) = map.get("type")
                && !kind.starts_with(RUNNER_EVENT_PREFIX)
                && !kind.is_empty()
            {
                return (kind.clone(), Value::Object(map));
            }
            ("output".to_string(), text_data(text, line.continued))
        }
    }
}

/// The outcome of a `command` turn: exit 0 → `succeeded`; stopped by the
/// runner for an interrupt → `interrupted` whatever the status; anything
/// else → `failed` with `agent_crashed`.
pub fn outcome(exit: &Exit, interrupted: bool) -> TurnOutcome {
    if interrupted {
        return TurnOutcome::interrupted();
    }
    match exit.status {
        Some(s) if s.success() => TurnOutcome {
            status: RunOutcome::Succeeded,
            agent_session_id: None,
            error: None,
            usage: None,
        },
        Some(s) => {
            let how = match (s.code(), s.signal()) {
                (Some(code), _) => format!("exited with status {code}"),
                (None, Some(sig)) => format!("was killed by signal {sig}"),
                (None, None) => "ended abnormally".to_string(),
            };
            TurnOutcome::failed(ErrorCode::AgentCrashed, format!("the agent {how}"))
        }
        None => TurnOutcome::failed(
            ErrorCode::AgentCrashed,
            "the agent's exit status could not be collected",
        ),
    }
}

/// The payload of the `hosted_boot.runner` event that opens every run.
pub fn runner_event(program: &str) -> Value {
    json!({
        "runnerVersion": env!("CARGO_PKG_VERSION"),
        "agent": "command",
        "program": program,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str) -> Line {
        Line {
            bytes: text.as_bytes().to_vec(),
            continued: false,
        }
    }

    #[test]
    fn json_lines_with_a_type_become_events() {
        let (kind, data) =
            event_for_line(Stream::Stdout, &line(r#"{"type":"message","text":"hi"}"#));
        assert_eq!(kind, "message");
        assert_eq!(data, json!({"type": "message", "text": "hi"}));
    }

    #[test]
    fn other_lines_are_output_and_runner_types_cannot_be_forged() {
        for text in [
            r#"{"type":"hosted_boot.harvest"}"#,
            r#"{"type":3}"#,
            "[1]",
            "plain",
            r#"{"x":1}"#,
        ] {
            let (kind, data) = event_for_line(Stream::Stdout, &line(text));
            assert_eq!(kind, "output", "{text}");
            assert_eq!(data, json!({"text": text}));
        }
        let (kind, _) = event_for_line(Stream::Stderr, &line(r#"{"type":"message"}"#));
        assert_eq!(kind, "stderr");
    }
}
