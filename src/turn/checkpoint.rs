//! Checkpoints on notice (PROTOCOL.md 4.5, "Checkpoint"): a notice
//! (SIGUSR1 or SIGUSR2, forwarded by the PID 1 reaper; `hosted-boot
//! checkpoint` sends one) while the agent runs saves its work as it stands
//! to `<branch>-recovered-checkpoint-<runId>`
//! ([`crate::workspace::checkpoint`]) and the agent state (2.7), without
//! stopping or touching the agent. The turn's harvest at its end is
//! unchanged.
//!
//! Notices are coalesced (those that come while one runs make one more) and
//! rate-limited ([`Timings::checkpoint_interval`](crate::timings::Timings)
//! between starts): an agent running as the runner's user can send them
//! too. A notice with no agent running is answered at once: every turn's
//! work is harvested at its end. Each answer is recorded in the status
//! file ([`crate::status::CheckpointStatus`]), which `hosted-boot
//! checkpoint` waits on.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde_json::json;
use tokio::sync::watch;

use super::TurnContext;
use crate::events::EventSender;
use crate::events::event::RunnerEvent;
use crate::status::{self, CheckpointStatus};
use crate::workspace::checkpoint::CheckpointJob;

/// The notices of a boot.
#[derive(Clone, Debug)]
pub struct Notices {
    requests: watch::Receiver<u64>,
    in_turn: Arc<AtomicBool>,
}

impl Notices {
    /// Notices counted by `requests` ([`crate::signals::listen_checkpoints`]);
    /// those that come while no agent runs are answered at once, from a
    /// task of their own.
    pub fn new(requests: watch::Receiver<u64>) -> Notices {
        let in_turn = Arc::new(AtomicBool::new(false));
        let mut between = requests.clone();
        let running = in_turn.clone();
        tokio::spawn(async move {
            while between.changed().await.is_ok() {
                between.borrow_and_update();
                if !running.load(Ordering::Acquire) {
                    tracing::info!(
                        "checkpoint notice with no agent running: nothing to save (every turn's work is harvested at its end)"
                    );
                    status::checkpoint(CheckpointStatus::starting("no_turn", None).finished());
                }
            }
        });
        Notices { requests, in_turn }
    }

    /// No notices (a boot that cannot listen for them).
    pub fn none() -> Notices {
        let (_, requests) = watch::channel(0);
        Notices {
            requests,
            in_turn: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// Marks an agent running until dropped.
struct InTurn<'a>(&'a AtomicBool);

impl Drop for InTurn<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Awaits `agent` (the turn's agent, step 4 of 4.1), answering every
/// notice meanwhile with a checkpoint of run `run_id`; `start` is the
/// commit the turn started from. A checkpoint still running when the agent
/// ends is cut: the harvest follows (and waits for its git work).
pub async fn during<T>(
    ctx: &TurnContext,
    run_id: &str,
    start: Option<String>,
    events: &EventSender,
    agent: impl Future<Output = T>,
) -> T {
    let mut requests = ctx.checkpoints.requests.clone();
    // Notices before the agent were answered between turns.
    requests.borrow_and_update();
    ctx.checkpoints.in_turn.store(true, Ordering::Release);
    let _in_turn = InTurn(&ctx.checkpoints.in_turn);
    let mut run = Run {
        ctx,
        run_id,
        start,
        events,
        previous: None,
        last_start: None,
    };
    tokio::pin!(agent);
    let ended = loop {
        tokio::select! {
            biased;
            ended = &mut agent => break ended,
            () = run.next(&mut requests) => {}
        }
    };
    if requests.has_changed().unwrap_or(false) {
        tracing::info!(
            run_id,
            "checkpoint notice as the agent ended: the turn's harvest saves the work"
        );
        status::checkpoint(CheckpointStatus::starting("turn_ended", Some(run_id)).finished());
    }
    ended
}

/// The checkpoints of one turn.
struct Run<'a> {
    ctx: &'a TurnContext,
    run_id: &'a str,
    start: Option<String>,
    events: &'a EventSender,
    /// The commit the last checkpoint of the run put on the remote.
    previous: Option<String>,
    last_start: Option<Instant>,
}

impl Run<'_> {
    /// Waits for a notice (and for the rate limit), then checkpoints;
    /// never completes once no notice can come.
    async fn next(&mut self, requests: &mut watch::Receiver<u64>) {
        if requests.changed().await.is_err() {
            return std::future::pending().await;
        }
        let timings = self.ctx.api.timings();
        if let Some(last) = self.last_start {
            let at = last + timings.checkpoint_interval;
            if at > Instant::now() {
                tracing::info!(
                    run_id = self.run_id,
                    wait_ms = (at - Instant::now()).as_millis() as u64,
                    "checkpoint notice: the last checkpoint was too recent; this one waits"
                );
                tokio::time::sleep_until(at.into()).await;
            }
        }
        requests.borrow_and_update();
        self.last_start = Some(Instant::now());
        let run_id = self.run_id;
        let mut record = CheckpointStatus::starting("running", Some(run_id));
        status::checkpoint(record.clone());
        tracing::info!(run_id, "checkpoint: saving the work as it stands");
        let job = CheckpointJob {
            run_id: run_id.to_string(),
            previous: self.previous.clone(),
            start: self.start.clone(),
            bound: timings.harvest_bound,
        };
        let report = self.ctx.harvester.checkpoint(job).await;
        record.commit = report.head_sha.clone();
        match &report.push_error {
            None if report.pushed => {
                self.previous = report.head_sha.clone();
                record.outcome = match &report.recovery_branch {
                    Some(branch) => {
                        record.branch = Some(branch.clone());
                        "pushed".to_string()
                    }
                    None => "on_remote".to_string(),
                };
            }
            None => record.outcome = "nothing".to_string(),
            Some(e) => {
                record.outcome = "failed".to_string();
                record.error = Some(e.message.clone());
            }
        }
        match serde_json::to_value(&report) {
            Ok(mut data) => {
                if let Some(map) = data.as_object_mut() {
                    map.insert("outcome".to_string(), json!(record.outcome));
                }
                self.events.emit(RunnerEvent::Checkpoint, data);
            }
            Err(e) => tracing::error!(error = %e, "cannot encode the checkpoint event"),
        }
        // The agent state as it stands, as after a turn (its own event).
        let save = super::agent_state::save(self.ctx, run_id, Some(self.events));
        if tokio::time::timeout(timings.agent_state_bound, save)
            .await
            .is_err()
        {
            tracing::warn!(
                run_id,
                "checkpoint: the agent state's save outlived its bound; cut"
            );
        }
        tracing::info!(
            run_id,
            outcome = %record.outcome,
            branch = record.branch.as_deref().unwrap_or(""),
            commit = record.commit.as_deref().unwrap_or(""),
            "checkpoint done"
        );
        status::checkpoint(record.finished());
    }
}
