//! The agent CLI's own session state carried across sandboxes (PROTOCOL.md
//! 2.7), when the session offers it (`session.agentState`): restored before
//! the boot's first agent when that turn resumes an agent session the CLI
//! has no state for, and saved after each turn's harvest and before its
//! seal, bounded and cut by a stop (on a graceful stop, after the seal,
//! with what is left of the stop budget). Neither is required: a failure is an event
//! (`hosted_boot.agent_state`) and the turn goes on as without it, the CLI
//! then starting a fresh agent session (`agentSessionReset`, 2.6).
//!
//! What the files are, and the checks on a state, are
//! [`crate::agent::state`]'s; this module talks to the coordinator.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};

use super::TurnContext;
use crate::agent::drive;
use crate::agent::state::{self, Place};
use crate::client::caps;
use crate::events::EventSender;
use crate::events::event::RunnerEvent;
use crate::wire::AgentStateOffer;

/// What the boot's turns share about the agent state.
#[derive(Debug, Default)]
pub struct Carry {
    /// The session's offer at boot; `None`: nothing is saved or restored.
    offer: Option<AgentStateOffer>,
    /// The restore was considered (the boot's first agent only).
    restore_considered: AtomicBool,
    /// A digest of the files of the last state saved (not of its body,
    /// which names its run), so that an unchanged one is not sent again.
    last_saved: Mutex<Option<u64>>,
}

impl Carry {
    /// For a session that offers `offer` (`session.agentState`).
    pub fn new(offer: Option<AgentStateOffer>) -> Carry {
        Carry {
            offer,
            ..Carry::default()
        }
    }
}

/// Where the turn's CLI keeps the agent session it resumes, when there is
/// one and the session offers the state.
fn place(ctx: &TurnContext) -> Option<(AgentStateOffer, Place)> {
    let offer = ctx.agent_state.offer?;
    // Before the CLI's environment is built (and its placeholder-key line
    // logged) for an agent whose state is not saved.
    state::Cli::of(ctx.agent.kind)?;
    let session = ctx.agent_session.resume_id()?;
    let env = drive::cli_env(&ctx.agent, &ctx.agent_env, &ctx.agent_session);
    let place = Place::new(&ctx.agent, env, &ctx.repo_dir, &session)?;
    Some((offer, place))
}

/// The event's data: what happened, for which CLI and agent session, and
/// the rest.
fn data(place: &Place, outcome: &str, rest: Value) -> Value {
    let mut data = json!({
        "outcome": outcome,
        "cli": place.cli().name(),
        "agentSessionId": place.session(),
    });
    if let (Some(data), Value::Object(rest)) = (data.as_object_mut(), rest) {
        data.extend(rest);
    }
    data
}

/// Before the boot's first agent: when its turn resumes an agent session
/// the CLI has no state for, loads the saved state and writes it where the
/// CLI looks, as the agent user. Says what it did in an event, except when
/// the CLI has its state already.
pub async fn restore(ctx: &TurnContext, events: &EventSender) {
    if ctx
        .agent_state
        .restore_considered
        .swap(true, Ordering::SeqCst)
    {
        return;
    }
    let Some((_, place)) = place(ctx) else {
        return;
    };
    if place.exists().await {
        tracing::debug!(
            agent_session = place.session(),
            "the CLI has its state for the agent session; nothing to restore"
        );
        return;
    }
    let emit = |outcome: &str, rest: Value| {
        events.emit(RunnerEvent::AgentState, data(&place, outcome, rest));
    };
    let reason = |e: &dyn std::fmt::Display| crate::wire::truncate_reason(&e.to_string());
    let answer = match ctx.api.agent_state_load().await {
        Ok(answer) => answer,
        Err(e) => {
            tracing::warn!(error = %e, "the agent state could not be loaded; the CLI starts a fresh agent session");
            emit("load_failed", json!({"reason": reason(&e)}));
            return;
        }
    };
    let Some(value) = answer.agent_state else {
        tracing::info!(
            agent_session = place.session(),
            "no agent state was saved for the session; the CLI starts a fresh agent session"
        );
        emit("none", json!({}));
        return;
    };
    let restored = match state::unpack(&place, value, caps::AGENT_STATE as u64) {
        Ok((files, saved_after)) => {
            let count = files.len();
            place
                .restore(files)
                .await
                .map(|bytes| (count, bytes, saved_after))
        }
        Err(e) => Err(e),
    };
    match restored {
        Ok((files, bytes, saved_after)) => {
            tracing::info!(
                agent_session = place.session(),
                files,
                bytes,
                dir = %place.dir().display(),
                "agent state restored"
            );
            emit(
                "restored",
                json!({"files": files, "bytes": bytes, "savedAfterRunId": saved_after}),
            );
        }
        Err(e) => {
            tracing::warn!(error = %e, "the saved agent state is refused; the CLI starts a fresh agent session");
            emit("refused", json!({"reason": reason(&e)}));
        }
    }
}

/// After the turn's agent: reads the CLI's state for the agent session it
/// reported, redacts it, and saves it unless it is the one saved last.
/// `events`: the run's, before the seal; `None` after it (a graceful stop),
/// when only the log says what happened.
pub async fn save(ctx: &TurnContext, run_id: &str, events: Option<&EventSender>) {
    let Some((offer, place)) = place(ctx) else {
        return;
    };
    let emit = |outcome: &str, rest: Value| {
        if let Some(events) = events {
            events.emit(RunnerEvent::AgentState, data(&place, outcome, rest));
        }
    };
    let reason = |e: &dyn std::fmt::Display| crate::wire::truncate_reason(&e.to_string());
    let max = offer.max_bytes.min(caps::AGENT_STATE as u64);
    // Base64 makes 4 bytes of 3: a state over this cannot fit.
    let limit = max / 4 * 3;
    let packed = match place.collect(limit).await {
        Ok(Some(files)) => {
            // Redacting megabytes is CPU work: off the runtime's threads.
            let (from, run) = (place.clone(), run_id.to_string());
            let redactor = ctx.api.redactor().clone();
            tokio::task::spawn_blocking(move || {
                let digest = digest(&files);
                let body = state::pack(&from, &run, &files, &redactor);
                Some((files.len(), body, digest))
            })
            .await
            .map_err(|e| state::StateError(format!("the save failed: {e}")))
        }
        Ok(None) => Ok(None),
        Err(e) => Err(e),
    };
    let (files, body, digest) = match packed {
        Ok(Some(packed)) => packed,
        Ok(None) => {
            tracing::debug!(
                agent_session = place.session(),
                "the CLI kept no state for the agent session; nothing to save"
            );
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "the agent state is not saved");
            emit("not_saved", json!({"reason": reason(&e), "maxBytes": max}));
            return;
        }
    };
    if body.len() as u64 > max {
        let reason = format!(
            "the agent state is {} bytes encoded, over the session's maxBytes ({max})",
            body.len()
        );
        tracing::warn!(reason, "the agent state is not saved");
        emit("not_saved", json!({"reason": reason, "maxBytes": max}));
        return;
    }
    if *crate::concurrency::lock(&ctx.agent_state.last_saved) == Some(digest) {
        tracing::debug!("the agent state is as saved after an earlier turn; not sent again");
        return;
    }
    let bytes = body.len();
    match ctx.api.agent_state_save(bytes::Bytes::from(body)).await {
        Ok(()) => {
            *crate::concurrency::lock(&ctx.agent_state.last_saved) = Some(digest);
            tracing::info!(
                agent_session = place.session(),
                files,
                bytes,
                "agent state saved"
            );
            emit("saved", json!({"files": files, "bytes": bytes}));
        }
        Err(e) => {
            tracing::warn!(error = %e, "the agent state could not be saved; the coordinator keeps the last one");
            emit("save_failed", json!({"reason": reason(&e)}));
        }
    }
}

/// A digest of a state's files (paths and bytes), to tell an unchanged
/// state.
fn digest(files: &[state::StateFile]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in files {
        f.path.hash(&mut h);
        f.bytes.hash(&mut h);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_the_files_and_only_them() {
        let file = |path: &str, bytes: &[u8]| state::StateFile {
            path: path.into(),
            bytes: bytes.to_vec(),
        };
        let a = [file("a.jsonl", b"1"), file("a/x", b"2")];
        assert_eq!(digest(&a), digest(&a.clone()));
        assert_ne!(
            digest(&a),
            digest(&[file("a.jsonl", b"1"), file("a/x", b"3")])
        );
        assert_ne!(
            digest(&a),
            digest(&[file("a.jsonl", b"1"), file("a/y", b"2")])
        );
        assert_ne!(digest(&a), digest(&a[..1]));
    }
}
