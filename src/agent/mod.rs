//! Agent adapters: given a turn, build the command; map each output line to
//! an event; map the exit to an outcome. `command` (any program) is the
//! first; Claude Code, Codex and opencode are the agents issue's. This is
//! the one planned extension point: a trait comes with the second adapter.

pub mod command;

use serde_json::Value;

use crate::wire::{ErrorCode, RunOutcome};

/// How a turn ended, as the agent adapter sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnOutcome {
    /// The terminal status.
    pub status: RunOutcome,
    /// The agent's own session id, when known.
    pub agent_session_id: Option<String>,
    /// Why it failed.
    pub error: Option<AgentError>,
    /// Token usage, when reported.
    pub usage: Option<Value>,
}

/// A failure class of the turn; `code` maps one to one onto the wire codes
/// of PROTOCOL.md 2.6.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentError {
    /// The wire code.
    pub code: ErrorCode,
    /// What happened (redacted before it is sent).
    pub message: String,
}

impl TurnOutcome {
    /// A turn that ended `interrupted`.
    pub fn interrupted() -> Self {
        TurnOutcome {
            status: RunOutcome::Interrupted,
            agent_session_id: None,
            error: None,
            usage: None,
        }
    }

    /// A turn that `failed` with `code`.
    pub fn failed(code: ErrorCode, message: impl Into<String>) -> Self {
        TurnOutcome {
            status: RunOutcome::Failed,
            agent_session_id: None,
            error: Some(AgentError {
                code,
                message: message.into(),
            }),
            usage: None,
        }
    }
}
