//! One turn (PROTOCOL.md 4.1): files, acknowledgements, bearer rotation and
//! interrupt watch, the agent under the supervisor with its events streamed,
//! then the harvest of its work (4.5, [`workspace_steps`]), the seal
//! (`finish`) and `turn_completed`.
//!
//! A stop signal during the turn (4.4) stops the agent's tree with the stop
//! grace, harvests within the stop's share, seals the run `interrupted` with
//! one attempt per call, and returns [`TurnEnd::Stopped`]; a second signal
//! skips what is left.

pub mod rotation;
pub mod watch;
pub mod workspace_steps;

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{mpsc, watch as tokio_watch};

use crate::agent::AgentConfig;
use crate::agent::drive::{self, DriveInput, RunRequest};
use crate::agent::{AgentSession, TurnOutcome};
use crate::client::{Api, Policy};
use crate::events::EventSink;
use crate::process::supervisor::Supervision;
use crate::session_dir::{RunDir, SessionDir};
use crate::signals::{Stop, StopBudget};
use crate::wire::{BootStatus, FinishBody, FinishError, HarvestResult};
use crate::workspace::Harvester;

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
    /// How the agent's processes are supervised (drain, time cap, cgroup).
    pub supervision: Supervision,
    /// What the agent keeps across turns: the session to resume, model,
    /// effort, the CLI's version.
    pub agent_session: Arc<AgentSession>,
    /// Commits and pushes the agent's work after each turn (4.5).
    pub harvester: Harvester,
    /// The harvest of a reused `repo/` at boot, reported as an event of the
    /// first turn (taken by it).
    pub recovered_at_boot: std::sync::Mutex<Option<HarvestResult>>,
}

/// The turn to run.
#[derive(Clone, Debug)]
pub struct TurnInput {
    /// The run it seals.
    pub run_id: String,
    /// The prompt (the body, the answer prompt of 4.3, or the task).
    pub prompt: String,
    /// The turn's ordinal (1 for the initial task), for the status file.
    pub ordinal: Option<u64>,
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
#[allow(
    clippy::large_enum_variant,
    reason = "one value per turn, moved a couple of times: boxing the body buys nothing"
)]
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
    /// Whether the turn's flush delivered every spooled event (false when
    /// not known): only then may the run directory go before a later boot
    /// has delivered its spool (PROTOCOL.md 3).
    pub events_delivered: bool,
}

fn fatal(run_id: &str, reason: impl Into<String>, seal: SealState) -> TurnFatal {
    TurnFatal {
        run_id: run_id.to_string(),
        reason: reason.into(),
        seal,
        events_delivered: false,
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

    let mut guard = StopBudget::new(stop.clone(), timings.stop_budget);

    // 1. task.txt and the bearer file.
    let run_dir = RunDir::create(&ctx.root, run_id)
        .map_err(|e| fatal(run_id, e.to_string(), SealState::NotSent))?;
    let remove_run_dir = |run_dir: &RunDir| {
        if let Err(e) = run_dir.remove() {
            tracing::warn!(run_id, error = %e, "cannot remove the run directory");
        }
    };
    let task_path = run_dir
        .write_task(&input.prompt)
        .map_err(|e| fatal(run_id, e.to_string(), SealState::NotSent))?;
    let fresh = match api.bearer() {
        Some(b) if !b.expires_within(timings.idle_refresh_lead) => Some(Ok(b)),
        _ => {
            guard
                .unless_stopped(api.pull_bearer(Policy::AGENT_TOKEN_REFRESH))
                .await
        }
    };
    let bearer = match fresh {
        // A stop before the turn was acknowledged: as between turns, nothing
        // is posted (PROTOCOL.md 4.4) and the run stays for the next sandbox.
        None => {
            remove_run_dir(&run_dir);
            return Ok(TurnEnd::Stopped(guard.current()));
        }
        Some(r) => r.map_err(|e| fatal(run_id, e.to_string(), SealState::NotSent))?,
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
    match guard
        .unless_stopped(api.post_status(BootStatus::TurnStarted, Some(run_id), None))
        .await
    {
        None => {
            remove_bearer();
            remove_run_dir(&run_dir);
            return Ok(TurnEnd::Stopped(guard.current()));
        }
        Some(Err(e)) => {
            remove_bearer();
            return Err(fatal(
                run_id,
                format!("turn_started was not acknowledged: {e}"),
                SealState::NotSent,
            ));
        }
        Some(Ok(())) => {}
    }
    // From here on a stop seals the run `interrupted` (4.4).
    match guard.unless_stopped(api.run_started(run_id)).await {
        None => {}
        Some(Err(e)) => {
            remove_bearer();
            return Err(fatal(
                run_id,
                format!("run_started was not acknowledged: {e}"),
                SealState::NotSent,
            ));
        }
        Some(Ok(())) => {}
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
    sender.emit(
        crate::events::event::RunnerEvent::Runner,
        drive::runner_event(
            &ctx.agent,
            &ctx.agent_session,
            &ctx.agent_env,
            &ctx.repo_dir,
        )
        .await,
    );
    if let Some(recovered) = crate::sync::lock(&ctx.recovered_at_boot).take() {
        workspace_steps::emit(&sender, &recovered);
    }
    // The workspace moves to the remote's session branch (what the user
    // pushed between turns) before the watch's first read, so that an
    // interrupt requested meanwhile still keeps the agent from starting.
    let start = match guard
        .unless_stopped(workspace_steps::before_turn(
            &ctx.harvester,
            run_id,
            &timings,
            &sender,
        ))
        .await
    {
        Some(synced) => synced.start_sha,
        // The sync goes on in the background; the harvest waits for it and
        // counts from the remote's session branch.
        None => None,
    };

    let interrupted = Arc::new(AtomicBool::new(false));
    let mut watch_task = None;
    let mut stopped_by: Option<Stop> = None;
    let (request_tx, mut request_rx) = mpsc::unbounded_channel();
    let first_read = if guard.stopping() {
        stopped_by = Some(guard.current());
        Ok(true)
    } else {
        watch::interrupt_requested(api, &ctx.session_dir.bearer_path(), run_id).await
    };
    let outcome = match first_read {
        Ok(true) => {
            tracing::info!(
                run_id,
                "interrupt or stop requested before the agent started; not starting it"
            );
            interrupted.store(true, Ordering::SeqCst);
            TurnOutcome {
                agent_session_id: ctx.agent_session.resume_id(),
                ..TurnOutcome::interrupted()
            }
        }
        other => {
            let over_cap = matches!(&other, Err(e) if e.over_cap);
            match other {
                Err(e) if e.over_cap => watch::log_over_cap(run_id, &e),
                Err(e) => {
                    tracing::warn!(run_id, error = %e, "first interrupt watch read failed; starting the agent anyway");
                }
                Ok(_) => {}
            }
            let flag = interrupted.clone();
            let tx = request_tx.clone();
            watch_task = Some(watch::spawn(
                api.clone(),
                ctx.session_dir.bearer_path(),
                run_id.to_string(),
                over_cap,
                move || {
                    flag.store(true, Ordering::SeqCst);
                    let _ = tx.send(RunRequest::Interrupt);
                },
            ));

            // 4. The agent (agent::drive: adapter, watchdogs, interrupts).
            let mut env = ctx.agent_env.clone();
            env.push((
                "ORIZU_TOKEN_FILE".into(),
                ctx.session_dir.bearer_path().into(),
            ));
            env.push(("ORIZU_TASK_FILE".into(), task_path.clone().into()));
            env.push(("ORIZU_RUN_ID".into(), run_id.into()));
            let input = DriveInput {
                config: ctx.agent.clone(),
                session: ctx.agent_session.clone(),
                prompt: input.prompt.clone(),
                cwd: ctx.repo_dir.clone(),
                env,
                events: sender.clone(),
                redactor: api.redactor().clone(),
                timings,
                supervision: ctx.supervision.clone(),
            };
            let driven = drive::run(input, &mut request_rx, stop).await;
            if driven.stopped_by.is_some() {
                stopped_by = driven.stopped_by;
            }
            driven.outcome
        }
    };
    // 5. Stop the watch and the rotation, remove the bearer file.
    if let Some(task) = watch_task {
        task.abort();
        let _ = task.await;
    }
    rotation.stop().await;
    remove_bearer();
    tracing::info!(run_id, status = outcome.status.as_str(), "turn outcome");

    // 6. Harvest, flush events, finish, turn_completed.
    // A stop that came after the agent ended keeps the outcome ("the seal in
    // progress keeps its status") but gets the stop's bounds: one attempt
    // each, within the stop budget; a second signal skips what is left.
    let harvested = workspace_steps::after_turn(
        &ctx.harvester,
        run_id,
        outcome.status,
        start,
        &timings,
        stop,
        &sender,
    )
    .await;
    drop(sender);
    let stopping = stopped_by.is_some() || guard.stopping();
    let flush_deadline = if stopping {
        timings.stop_flush
    } else {
        timings.event_flush_deadline
    };
    let Some(report) = guard.bounded(sink.close(flush_deadline)).await else {
        return Ok(TurnEnd::Stopped(guard.current()));
    };
    let mut body = FinishBody {
        status: outcome.status,
        agent_session_id: outcome.agent_session_id.clone(),
        error: outcome.error.as_ref().map(|e| FinishError {
            code: e.code,
            message: e.message.clone(),
            retryable: e.retryable,
            retry_after_ms: e.retry_after_ms,
            resets_at: e.resets_at.clone(),
        }),
        usage: outcome.usage.clone(),
        result: harvested,
    };
    report.record_in(&mut body.error);
    let policy = if guard.stopping() {
        Policy::ONCE
    } else {
        Policy::REQUIRED
    };
    match guard.bounded(api.finish(run_id, &body, policy)).await {
        None => return Ok(TurnEnd::Stopped(guard.current())),
        Some(Err(e)) if guard.stopping() => {
            tracing::error!(run_id, error = %e, "finish failed during the graceful stop");
            return Ok(TurnEnd::Stopped(guard.current()));
        }
        Some(Err(e)) => {
            return Err(TurnFatal {
                events_delivered: report.undelivered() == 0,
                ..fatal(
                    run_id,
                    format!("finish was not acknowledged: {e}"),
                    SealState::Unknown(body),
                )
            });
        }
        Some(Ok(())) => {}
    }
    tracing::info!(run_id, status = outcome.status.as_str(), "run sealed");
    if report.undelivered() == 0 {
        remove_run_dir(&run_dir);
    }
    let policy = if guard.stopping() {
        Policy::ONCE
    } else {
        Policy::REQUIRED
    };
    let completed = guard
        .bounded(api.post_status_with(BootStatus::TurnCompleted, Some(run_id), None, policy))
        .await;
    match completed {
        None => return Ok(TurnEnd::Stopped(guard.current())),
        Some(Err(e)) if guard.stopping() => {
            tracing::error!(run_id, error = %e, "turn_completed failed during the graceful stop");
        }
        Some(Err(e)) => {
            return Err(fatal(
                run_id,
                format!("turn_completed was not acknowledged: {e}"),
                SealState::Sealed,
            ));
        }
        Some(Ok(())) => {}
    }
    if guard.stopping() {
        return Ok(TurnEnd::Stopped(guard.current()));
    }
    Ok(TurnEnd::Sealed(outcome))
}
