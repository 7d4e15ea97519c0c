//! One turn (PROTOCOL.md 4.1): files, acknowledgements, bearer rotation and
//! interrupt watch, the agent under the supervisor with its events streamed,
//! then the seal (`finish`) and `turn_completed`.
//!
//! A stop signal during the turn (4.4) stops the agent's tree with the stop
//! grace, seals the run `interrupted` with one attempt per call, and returns
//! [`TurnEnd::Stopped`]; a second signal skips what is left.

pub mod events;
pub mod lines;
pub mod output;
pub mod rotation;
pub mod spool;
pub mod supervisor;
pub mod watch;

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::json;
use tokio::sync::{mpsc, watch as tokio_watch};

use crate::agent::{self, TurnOutcome};
use crate::client::Api;
use crate::config::AgentConfig;
use crate::signals::Stop;
use crate::timings::RetryPolicy;
use crate::wire::{BootStatus, ErrorCode, FinishBody, FinishError};
use crate::workspace::files::{RunDir, SessionDir};
use events::EventSink;
use supervisor::{Control, SpawnSpec};

/// What every turn of the boot shares.
pub struct TurnContext {
    /// The coordinator client.
    pub api: Arc<Api>,
    /// The session directory (bearer file).
    pub session_dir: Arc<SessionDir>,
    /// The root (for `.orizu-run/`).
    pub root: PathBuf,
    /// `repo/`, the agent's working directory.
    pub repo_dir: PathBuf,
    /// The agent.
    pub agent: AgentConfig,
    /// The agent's environment without the per-turn variables.
    pub agent_env: Vec<(OsString, OsString)>,
}

/// The turn to run.
#[derive(Clone, Debug)]
pub struct TurnInput {
    /// The run it seals.
    pub run_id: String,
    /// The prompt (the body, the answer prompt of 4.3, or the task).
    pub prompt: String,
}

/// How a turn ended when it did not end the boot with an error.
#[derive(Clone, Debug)]
pub enum TurnEnd {
    /// Sealed and acknowledged; a `failed` outcome is fatal for the boot.
    Sealed(TurnOutcome),
    /// A stop signal ended it (4.4); the boot exits 128+N.
    Stopped(Stop),
}

/// Where the seal of the run stands, for the fatal path of 4 step 7.
#[derive(Clone, Debug, PartialEq)]
pub enum SealState {
    /// No `finish` was sent.
    NotSent,
    /// A `finish` was sent but its outcome is unknown: resend the same body.
    Unknown(FinishBody),
    /// The run is sealed.
    Sealed,
}

/// A fatal error during a turn: the boot reports it for `run_id`.
#[derive(Debug)]
pub struct TurnFatal {
    /// The run.
    pub run_id: String,
    /// What failed (redacted when sent).
    pub reason: String,
    /// Whether the run still needs a seal.
    pub seal: SealState,
}

fn fatal(run_id: &str, reason: impl Into<String>, seal: SealState) -> TurnFatal {
    TurnFatal {
        run_id: run_id.to_string(),
        reason: reason.into(),
        seal,
    }
}

/// Runs one turn to its seal.
///
/// Errors: [`TurnFatal`] when a required call fails or the files cannot be
/// written; the caller seals the run `failed` (`runner_error`) if needed and
/// posts `turn_failed`.
pub async fn run(
    ctx: &TurnContext,
    input: TurnInput,
    stop: &mut tokio_watch::Receiver<Stop>,
) -> Result<TurnEnd, TurnFatal> {
    let api = &ctx.api;
    let timings = *api.timings();
    let run_id = input.run_id.as_str();
    tracing::info!(run_id, "turn starting");

    // 1. task.txt and the bearer file.
    let run_dir = RunDir::create(&ctx.root, run_id)
        .map_err(|e| fatal(run_id, e.to_string(), SealState::NotSent))?;
    let task_path = run_dir
        .write_task(&input.prompt)
        .map_err(|e| fatal(run_id, e.to_string(), SealState::NotSent))?;
    let bearer = match api.bearer() {
        Some(b) if !b.expires_within(timings.idle_refresh_lead) => b,
        _ => api
            .pull_bearer(timings.retry.agent_token_refresh)
            .await
            .map_err(|e| fatal(run_id, e.to_string(), SealState::NotSent))?,
    };
    ctx.session_dir
        .write_bearer(&bearer.token)
        .map_err(|e| fatal(run_id, e.to_string(), SealState::NotSent))?;
    let remove_bearer = || {
        if let Err(e) = ctx.session_dir.remove_bearer() {
            tracing::error!(error = %e, "cannot remove the bearer file");
        }
    };

    // 2. Acknowledgements.
    if let Err(e) = api
        .post_status(BootStatus::TurnStarted, Some(run_id), None)
        .await
    {
        remove_bearer();
        return Err(fatal(
            run_id,
            format!("turn_started was not acknowledged: {e}"),
            SealState::NotSent,
        ));
    }
    if let Err(e) = api.run_started(run_id).await {
        remove_bearer();
        return Err(fatal(
            run_id,
            format!("run_started was not acknowledged: {e}"),
            SealState::NotSent,
        ));
    }

    // The run's event spool (resumed if a killed runner left one).
    let sink = match EventSink::open(api.clone(), &run_dir, run_id).await {
        Ok(sink) => sink,
        Err(e) => {
            remove_bearer();
            return Err(fatal(run_id, e.to_string(), SealState::NotSent));
        }
    };

    // 3. Rotation, interrupt watch (first read before the agent starts).
    let rotation = rotation::Rotation::start(api.clone(), ctx.session_dir.clone());
    let sender = sink.sender();
    let (program, args) = match &ctx.agent {
        AgentConfig::Command { program, args } => (program.clone(), args.clone()),
    };
    sender.emit("hosted_boot.runner", agent::command::runner_event(&program));

    let interrupted = Arc::new(AtomicBool::new(false));
    let (control_tx, control_rx) = mpsc::unbounded_channel();
    let first_read = watch::interrupt_requested(api, &ctx.session_dir.bearer_path(), run_id).await;
    let mut watch_task = None;
    let mut stopped_by: Option<Stop> = None;
    let outcome = match first_read {
        Ok(true) => {
            tracing::info!(
                run_id,
                "interrupt requested before the agent started; not starting it"
            );
            interrupted.store(true, Ordering::SeqCst);
            TurnOutcome::interrupted()
        }
        other => {
            if let Err(e) = other {
                tracing::warn!(run_id, error = %e, "first interrupt watch read failed; starting the agent anyway");
            }
            let flag = interrupted.clone();
            let tx = control_tx.clone();
            let grace = timings.interrupt_grace;
            watch_task = Some(watch::spawn(
                api.clone(),
                ctx.session_dir.bearer_path(),
                run_id.to_string(),
                move || {
                    flag.store(true, Ordering::SeqCst);
                    let _ = tx.send(Control::Interrupt { grace });
                },
            ));

            // 4. The agent.
            let mut env = ctx.agent_env.clone();
            env.push((
                "ORIZU_TOKEN_FILE".into(),
                ctx.session_dir.bearer_path().into(),
            ));
            env.push(("ORIZU_TASK_FILE".into(), task_path.clone().into()));
            env.push(("ORIZU_RUN_ID".into(), run_id.into()));
            let spec = SpawnSpec {
                program: program.clone(),
                args,
                cwd: ctx.repo_dir.clone(),
                env,
                stdin: input.prompt.clone().into_bytes(),
            };
            let output = |stream| {
                output::OutputStream::new(
                    stream,
                    api.redactor(),
                    sender.clone(),
                    agent::command::event_for_line,
                )
            };
            let supervised = supervisor::run(spec, control_rx, timings.pipe_drain, output);
            tokio::pin!(supervised);
            let result = loop {
                tokio::select! {
                    r = &mut supervised => break r,
                    changed = stop.changed() => {
                        if changed.is_err() {
                            continue;
                        }
                        let s = *stop.borrow_and_update();
                        stopped_by = Some(s);
                        match s {
                            Stop::Graceful(_) => { let _ = control_tx.send(Control::Interrupt { grace: timings.stop_grace }); }
                            Stop::Immediate(_) => { let _ = control_tx.send(Control::Kill); }
                            Stop::Running => {}
                        }
                    }
                }
            };
            match result {
                Ok(exit) => agent::command::outcome(
                    &exit,
                    interrupted.load(Ordering::SeqCst) || stopped_by.is_some(),
                ),
                Err(e) => {
                    tracing::error!(run_id, error = %e, "agent spawn failed");
                    sender.emit(
                        "hosted_boot.spawn_failed",
                        json!({"program": program, "error": e.reason}),
                    );
                    TurnOutcome::failed(ErrorCode::AgentSpawnFailed, e.to_string())
                }
            }
        }
    };
    // 5. Stop the watch and the rotation, remove the bearer file.
    if let Some(task) = watch_task {
        task.abort();
        let _ = task.await;
    }
    rotation.stop().await;
    remove_bearer();
    drop(sender);
    tracing::info!(run_id, status = outcome.status.as_str(), "agent finished");

    // 6. Harvest (the harvest issue), flush events, finish, turn_completed.
    // A stop that came after the agent ended keeps the outcome ("the seal in
    // progress keeps its status") but gets the stop's bounds.
    let stopping = stopped_by.is_some() || *stop.borrow() != Stop::Running;
    if matches!(*stop.borrow(), Stop::Immediate(_)) {
        let _ = sink.close(std::time::Duration::ZERO).await;
        return Ok(TurnEnd::Stopped(*stop.borrow()));
    }
    let flush_deadline = if stopping {
        timings.stop_flush
    } else {
        timings.event_flush_deadline
    };
    let report = sink.close(flush_deadline).await;
    let mut body = FinishBody {
        status: outcome.status,
        agent_session_id: outcome.agent_session_id.clone(),
        error: outcome.error.as_ref().map(|e| FinishError {
            code: e.code,
            message: e.message.clone(),
            retryable: false,
            retry_after_ms: None,
            resets_at: None,
        }),
        usage: outcome.usage.clone(),
        result: None,
    };
    report.record_in(&mut body.error);
    let policy = if stopping {
        RetryPolicy::ONCE
    } else {
        timings.retry.required
    };
    if let Err(e) = api.finish(run_id, &body, policy).await {
        if stopping {
            tracing::error!(run_id, error = %e, "finish failed during the graceful stop");
            return Ok(TurnEnd::Stopped(*stop.borrow()));
        }
        return Err(fatal(
            run_id,
            format!("finish was not acknowledged: {e}"),
            SealState::Unknown(body),
        ));
    }
    tracing::info!(run_id, status = outcome.status.as_str(), "run sealed");
    if report.undelivered() == 0
        && let Err(e) = run_dir.remove()
    {
        tracing::warn!(run_id, error = %e, "cannot remove the run directory");
    }
    let completed = if stopping {
        api.post_status_with(
            BootStatus::TurnCompleted,
            Some(run_id),
            None,
            RetryPolicy::ONCE,
        )
        .await
    } else {
        api.post_status(BootStatus::TurnCompleted, Some(run_id), None)
            .await
    };
    if let Err(e) = completed {
        if stopping {
            tracing::error!(run_id, error = %e, "turn_completed failed during the graceful stop");
        } else {
            return Err(fatal(
                run_id,
                format!("turn_completed was not acknowledged: {e}"),
                SealState::Sealed,
            ));
        }
    }
    if stopping {
        return Ok(TurnEnd::Stopped(*stop.borrow()));
    }
    Ok(TurnEnd::Sealed(outcome))
}
