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
//! too. From the agent's start to the end of its turn's harvest the turn
//! answers them ([`TurnNotices`]): one that comes once the agent ended, or
//! that the agent's end cut, is answered with the harvest's result. Outside
//! turns a notice is answered at once: every turn's work is harvested at
//! its end. Each answer is recorded in the status file
//! ([`crate::status::CheckpointStatus`]), which `hosted-boot checkpoint`
//! waits on.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::json;
use tokio::sync::watch;

use super::TurnContext;
use crate::events::EventSender;
use crate::events::event::RunnerEvent;
use crate::redact::Redactor;
use crate::status::{self, CheckpointStatus};
use crate::wire::HarvestResult;
use crate::workspace::checkpoint::CheckpointJob;

/// The notices of a boot.
#[derive(Clone, Debug)]
pub struct Notices {
    requests: watch::Receiver<u64>,
    /// Whether a turn answers the notices now.
    in_turn: Arc<Mutex<bool>>,
}

impl Notices {
    /// Notices counted by `requests` ([`crate::signals::listen_checkpoints`]);
    /// those that come while no turn answers them are answered at once,
    /// from a task of their own.
    pub fn new(requests: watch::Receiver<u64>) -> Notices {
        let in_turn = Arc::new(Mutex::new(false));
        let mut between = requests.clone();
        let turn = in_turn.clone();
        tokio::spawn(async move {
            while between.changed().await.is_ok() {
                between.borrow_and_update();
                // Under the lock: a turn that takes the notices over meanwhile
                // answers this one itself.
                let in_turn = crate::concurrency::lock(&turn);
                if !*in_turn {
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
            in_turn: Arc::new(Mutex::new(false)),
        }
    }

    /// The turn `run_id` answers the notices from now until the returned
    /// value is dropped (after its harvest).
    pub fn enter_turn<'a>(&'a self, run_id: &'a str) -> TurnNotices<'a> {
        let mut requests = self.requests.clone();
        {
            let mut in_turn = crate::concurrency::lock(&self.in_turn);
            // Notices before were answered between turns.
            requests.borrow_and_update();
            *in_turn = true;
        }
        TurnNotices {
            notices: self,
            run_id,
            requests,
            owed: false,
            answered: false,
        }
    }
}

/// A turn's hold on the notices ([`Notices::enter_turn`]).
pub struct TurnNotices<'a> {
    notices: &'a Notices,
    run_id: &'a str,
    requests: watch::Receiver<u64>,
    /// A notice the agent's end left unanswered (cut, or come since).
    owed: bool,
    answered: bool,
}

impl TurnNotices<'_> {
    /// Awaits `agent` (the turn's agent, step 4 of 4.1), answering every
    /// notice meanwhile with a checkpoint; `start` is the commit the turn
    /// started from. A checkpoint still running when the agent ends is cut
    /// (its git work finishes before the harvest's) and answered by
    /// [`TurnNotices::harvested`].
    pub async fn during<T>(
        &mut self,
        ctx: &TurnContext,
        start: Option<String>,
        events: &EventSender,
        agent: impl Future<Output = T>,
    ) -> T {
        let mut run = Run {
            ctx,
            run_id: self.run_id,
            start,
            events,
            previous: None,
            last_start: None,
            in_flight: false,
        };
        tokio::pin!(agent);
        let ended = loop {
            tokio::select! {
                biased;
                ended = &mut agent => break ended,
                () = run.next(&mut self.requests) => {}
            }
        };
        if run.in_flight {
            tracing::info!(
                run_id = self.run_id,
                "the agent ended during a checkpoint: cut; the turn's harvest saves the work"
            );
            self.owed = true;
        }
        ended
    }

    /// After the turn's harvest: answers a notice owed with its result
    /// (`None`: no harvest ran), and any that came since the agent ended.
    pub fn harvested(mut self, result: Option<&HarvestResult>, redactor: &Redactor) {
        self.answer(result, redactor);
    }

    fn answer(&mut self, result: Option<&HarvestResult>, redactor: &Redactor) {
        if self.answered {
            return;
        }
        self.answered = true;
        let mut in_turn = crate::concurrency::lock(&self.notices.in_turn);
        *in_turn = false;
        if !(self.owed || self.requests.has_changed().unwrap_or(false)) {
            return;
        }
        self.requests.borrow_and_update();
        let mut record = CheckpointStatus::starting("turn_ended", Some(self.run_id));
        if let Some(r) = result {
            record.commit = r.head_sha.clone();
            record.branch = Some(r.recovery_branch.clone().unwrap_or(r.branch.clone()));
            match &r.push_error {
                None if r.pushed => record.outcome = "harvested".to_string(),
                e => {
                    record.outcome = "failed".to_string();
                    record.error = Some(redactor.redact(&e.as_ref().map_or_else(
                        || "the turn's harvest did not push the work".to_string(),
                        |e| format!("the turn's harvest: {}", e.message),
                    )));
                }
            }
        }
        tracing::info!(run_id = self.run_id, outcome = %record.outcome, "checkpoint notice answered by the turn's harvest");
        status::checkpoint(record.finished());
    }
}

impl Drop for TurnNotices<'_> {
    fn drop(&mut self) {
        // A turn that ended before its harvest: the notices are the boot's
        // again, a notice owed answered without a result.
        self.answer(None, &Redactor::new());
    }
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
    /// A checkpoint runs (its future may be dropped mid-way).
    in_flight: bool,
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
        self.in_flight = true;
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
        record.branch = report.recovery_branch.clone();
        let redactor = self.ctx.api.redactor();
        record.outcome = match (&report.push_error, report.pushed) {
            (None, true) if report.recovery_branch.is_some() => "pushed",
            (None, true) => "on_remote",
            (None, false) => "nothing",
            // The agent's commits went, what it left uncommitted did not
            // (an index libgit2 cannot read).
            (Some(_), true) => "partial",
            (Some(_), false) => "failed",
        }
        .to_string();
        if report.pushed {
            self.previous = report.head_sha.clone();
        }
        record.error = report
            .push_error
            .as_ref()
            .map(|e| redactor.redact(&e.message));
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
        self.in_flight = false;
    }
}
