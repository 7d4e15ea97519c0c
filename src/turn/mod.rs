//! One turn (PROTOCOL.md 4.1): files, acknowledgements, bearer rotation and
//! interrupt watch, the agent under the supervisor with its events streamed,
//! then the harvest of its work (4.5, [`workspace_steps`]), the seal
//! (`finish`) and `turn_completed`.
//!
//! A stop signal during the turn (4.4) stops the agent's tree with the stop
//! grace, harvests within the stop's share, seals the run `interrupted` with
//! one attempt per call, and returns [`TurnEnd::Stopped`]; a second signal
//! skips what is left.

pub mod agent_state;
pub mod checkpoint;
pub mod rotation;
pub mod setup;
pub mod watch;
pub mod workspace_steps;

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::{mpsc, watch as tokio_watch};
use tokio::task::JoinHandle;
use tracing::Instrument as _;

use crate::agent::AgentConfig;
use crate::agent::drive::{self, DriveInput, RunRequest};
use crate::agent::{AgentSession, TurnOutcome};
use crate::agent_api::AgentApi;
use crate::client::{Api, LongPoll, Policy};
use crate::events::event::RunnerEvent;
use crate::events::{EventSender, EventSink, FlushReport};
use crate::process::supervisor::Supervision;
use crate::session_dir::{RunDir, SessionDir, SessionDirError, TurnFile};
use crate::signals::{Stop, StopBudget};
use crate::timings::Timings;
use crate::wire::{BootStatus, ErrorCode, FinishBody, FinishError, HarvestResult, RunOutcome};
use crate::workspace::Harvester;
use rotation::Rotation;

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
    /// How the agent reaches the coordinator's API (`--agent-api`): what
    /// the bearer file holds, whether the rotation writes it, where the
    /// interrupt watch takes its bearer.
    pub agent_api: AgentApi,
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
    /// What the completion of a fresh clone did (submodules, LFS), reported
    /// as the first turn's `hosted_boot.workspace` event (taken by it);
    /// `None`: nothing to report.
    pub completion: std::sync::Mutex<Option<crate::workspace::completion::Completion>>,
    /// The repository's setup, run before the first agent of the boot
    /// (PROTOCOL.md 4.1, "Setup"); `None`: no setup script is set.
    pub setup: Option<setup::Setup>,
    /// The egress canary started at boot: the first turn waits for its
    /// result before its agent starts (4.1 step 3).
    pub egress_canary: crate::egress::Pending,
    /// The platform's instructions for the agent (the session's, or
    /// `--instructions-file`'s), written into each turn's run directory.
    pub instructions: Option<String>,
    /// The instructions' copy in the session directory, written once at
    /// boot: the path the CLIs are started with.
    pub instructions_file: Option<PathBuf>,
    /// The credential broker (broker mode): its socket answers the agent's
    /// git only while a turn's token is written.
    pub broker: Option<crate::workspace::Broker>,
    /// `--prestart-agent`: the next turn's agent is started while the
    /// runner waits for that turn ([`prestart`]).
    pub prestart_agent: bool,
    /// The agent started ahead of the next turn: taken by that turn's
    /// agent, or discarded by the boot ([`discard_prestarted`]).
    pub prestarted: std::sync::Mutex<Option<drive::Prestarted>>,
    /// The agent CLI's state carried across sandboxes (PROTOCOL.md 2.7).
    pub agent_state: agent_state::Carry,
    /// Checkpoint notices, answered while the agent runs (4.5,
    /// "Checkpoint").
    pub checkpoints: checkpoint::Notices,
}

/// Starts the next turn's agent CLI now (the runner is about to wait for
/// that turn), when `--prestart-agent` is on and the CLI can wait for its
/// prompt.
pub async fn prestart(ctx: &TurnContext) {
    if !ctx.prestart_agent
        || !drive::prestartable(ctx.agent.kind)
        || crate::concurrency::lock(&ctx.prestarted).is_some()
    {
        return;
    }
    let env = boot_wide_env(ctx);
    let process = drive::AgentProcess {
        config: &ctx.agent,
        session: &ctx.agent_session,
        cwd: &ctx.repo_dir,
        redactor: ctx.api.redactor(),
        supervision: &ctx.supervision,
    };
    let started = drive::prestart(process, &env, cli_instructions(ctx)).await;
    *crate::concurrency::lock(&ctx.prestarted) = started;
}

/// The agent's environment with the per-turn paths that are the same for
/// the whole boot (the bearer file's, the turn file's): all a CLI started
/// ahead of its turn gets; a turn adds its own variables.
fn boot_wide_env(ctx: &TurnContext) -> Vec<(OsString, OsString)> {
    let mut env = ctx.agent_env.clone();
    env.push((
        "ORIZU_TOKEN_FILE".into(),
        ctx.session_dir.bearer_path().into(),
    ));
    env.push(("ORIZU_TURN_FILE".into(), ctx.session_dir.turn_path().into()));
    env
}

/// The instructions as the agent CLIs are started with them: the session
/// directory's copy.
fn cli_instructions(ctx: &TurnContext) -> Option<crate::agent::Instructions> {
    Some(crate::agent::Instructions {
        text: ctx.instructions.clone()?,
        file: ctx.instructions_file.clone()?,
    })
}

/// Kills the pre-started agent, if any (the session ended, the runner
/// stops, or a turn did not use it).
pub async fn discard_prestarted(ctx: &TurnContext, why: &str) {
    let prestarted = crate::concurrency::lock(&ctx.prestarted).take();
    if let Some(p) = prestarted {
        p.discard(why).await;
    }
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
    /// The coordinator's trace context of the turn (`pendingTurn`'s
    /// `traceparent`, `tracestate`), which the turn's span continues.
    pub trace: Option<(String, Option<String>)>,
}

/// How a turn ended when it did not end the boot with an error.
#[allow(
    clippy::large_enum_variant,
    reason = "one value per turn, returned once: boxing the outcome buys nothing"
)]
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
    /// A `finish` was refused with a verdict (a `4xx`, PROTOCOL.md 2): never
    /// repeated; the fatal path seals the run `failed` (`runner_error`)
    /// instead, with this body's harvest result (4 step 7).
    Refused(FinishBody),
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

/// Runs one turn to its seal: the steps of PROTOCOL.md 4.1 over one
/// [`Turn`], which undoes what they set up whichever step ends the turn.
///
/// Errors: [`TurnFatal`] when a required call fails or the files cannot be
/// written; the caller seals the run `failed` (`runner_error`) if needed and
/// posts `turn_failed`.
pub async fn run(
    ctx: &TurnContext,
    input: TurnInput,
    stop: &mut tokio_watch::Receiver<Stop>,
) -> Result<TurnEnd, TurnFatal> {
    let run_id = input.run_id.as_str();
    tracing::info!(run_id, "turn starting");
    let mut turn = Turn::open(ctx, run_id, input.ordinal, stop)
        .map_err(|e| fatal(run_id, e.to_string(), SealState::NotSent))?;
    let steps = turn.steps(&input).await;
    turn.end(steps).await
}

/// Why a step ended the turn before its seal.
enum Early {
    /// A stop before `turn_started` was acknowledged: as between turns,
    /// nothing is posted and the run directory goes (PROTOCOL.md 4.4).
    StoppedBeforeAck,
    /// A stop once the turn was acknowledged, or the stop budget ran out:
    /// what is left is skipped and the run directory stays.
    Stopped,
    /// A required call failed or a file could not be written (the
    /// [`TurnFatal`] reason).
    Failed(String),
}

/// Kills whatever of an earlier turn is still in the runner's tree (outside
/// its own process group) before this turn's token is written, so that no
/// process that outlived its turn can read it (issue 32): nothing,
/// normally, as every turn ends with a sweep that stops only on a scan that
/// proves the tree empty, but that sweep is bounded. The agent API proxy
/// serves only that tree (`agent_api::peer`).
///
/// Errors: processes still alive after the sweep's bound (uninterruptible,
/// or outside the runner's reach): the turn does not start.
async fn leftovers_gone(spare: Option<i32>) -> Result<(), String> {
    use crate::process::tree;
    let report = tree::sweep_sparing(
        tree::Runner::current(),
        0,
        Vec::new,
        spare,
        crate::process::supervisor::SWEEP_BOUND,
    )
    .await;
    if !report.killed.is_empty() {
        let names: Vec<String> = report
            .killed
            .iter()
            .map(|v| format!("{} ({})", v.pid, v.name))
            .collect();
        tracing::warn!(
            processes = %names.join(", "),
            "processes started before this turn (by an earlier turn, or by the agent pre-started for it outside its session) were still alive at this turn's start; killed before its token was written"
        );
    }
    if report.left.is_empty() {
        return Ok(());
    }
    let pids: Vec<String> = report.left.iter().map(|p| p.to_string()).collect();
    Err(format!(
        "processes started before this turn (pids {}) are still alive after {} of SIGKILL; the runner starts no turn whose token they could read (look for processes in uninterruptible sleep, state D in /proc/<pid>/stat)",
        pids.join(", "),
        humantime::format_duration(crate::process::supervisor::SWEEP_BOUND)
    ))
}

/// One turn in progress and what it must undo on every way out: the bearer
/// file the agent reads (PROTOCOL.md 4.1 steps 1 and 5), the bearer rotation
/// that rewrites it and the interrupt watch that reads it (both stopped
/// before the file goes, so nothing recreates it), the run's event sink
/// (flushed once), and where the seal stands for the boot's fatal path.
/// [`Turn::end`] undoes them whichever step ended the turn; `Drop` removes
/// the file and stops the tasks of a turn that never got there (a panic).
struct Turn<'a> {
    ctx: &'a TurnContext,
    run_id: &'a str,
    /// The turn's ordinal and start, for its summary line.
    ordinal: Option<u64>,
    started: std::time::Instant,
    timings: Timings,
    stop: &'a mut tokio_watch::Receiver<Stop>,
    budget: StopBudget,
    run_dir: RunDir,
    /// The bearer file is written and not yet removed.
    bearer_written: bool,
    rotation: Option<Rotation>,
    watch: Option<JoinHandle<()>>,
    /// The run's event sink, until it is flushed.
    events: Option<EventSink>,
    seal: SealState,
    /// What [`TurnFatal::events_delivered`] reports: set when `finish` fails
    /// after the flush (the only fatal path that knows).
    events_delivered: bool,
    /// The platform's instructions as written for this turn.
    instructions: Option<crate::agent::Instructions>,
    /// The run's `hosted_boot.runner` event while it waits for the CLI's
    /// `--version` (the boot's first run only, when the probe is slow).
    runner_event: Option<drive::RunnerEventTask>,
}

impl<'a> Turn<'a> {
    /// Creates the run directory.
    ///
    /// Errors: the run directory cannot be created.
    fn open(
        ctx: &'a TurnContext,
        run_id: &'a str,
        ordinal: Option<u64>,
        stop: &'a mut tokio_watch::Receiver<Stop>,
    ) -> Result<Turn<'a>, SessionDirError> {
        let timings = *ctx.api.timings();
        let budget = StopBudget::new(stop.clone(), timings.stop_budget);
        let run_dir = RunDir::create(&ctx.root, run_id)?;
        Ok(Turn {
            ctx,
            run_id,
            ordinal,
            started: std::time::Instant::now(),
            timings,
            stop,
            budget,
            run_dir,
            bearer_written: false,
            rotation: None,
            watch: None,
            events: None,
            seal: SealState::NotSent,
            events_delivered: false,
            instructions: None,
            runner_event: None,
        })
    }

    /// The steps of 4.1, in order; the first that ends the turn early says
    /// why.
    async fn steps(&mut self, input: &TurnInput) -> Result<TurnOutcome, Early> {
        // 1. task.txt and the bearer file.
        let task_path = self.write_files(&input.prompt).await?;
        // 2. Acknowledgements.
        self.acknowledge().await?;
        // 3. The run's event spool, rotation, the workspace sync, the
        // interrupt watch (first read before the agent starts).
        let events = self.open_events().await?;
        let start = self.before_agent(&events).await;
        // 4. The agent (agent::drive: adapter, watchdogs, interrupts).
        crate::status::turn_step(crate::status::TurnStep::Agent);
        let (ctx, run_id) = (self.ctx, self.run_id);
        let mut notices = ctx.checkpoints.enter_turn(run_id);
        let agent = self.run_agent(input, task_path, &events);
        let (outcome, stopped_by) = notices.during(ctx, start.clone(), &events, agent).await;
        crate::status::agent_pid(None);
        // 5. Stop the watch and the rotation, remove the bearer file.
        self.release().await;
        tracing::info!(
            run_id = self.run_id,
            status = outcome.status.as_str(),
            "turn outcome"
        );
        // 6. Harvest, flush events, finish, turn_completed.
        crate::status::turn_step(crate::status::TurnStep::Harvest);
        // The runner event of a first run whose CLI answers `--version`
        // late is awaited alongside the harvest, never before the agent.
        let runner_event = self.runner_event.take();
        let stop = self.stop.clone();
        let saving = events.clone();
        let (harvested, ()) =
            tokio::join!(self.harvest(outcome.status, start, events), async move {
                if let Some(pending) = runner_event {
                    pending.settled(stop).await;
                }
            });
        notices.harvested(harvested.as_ref(), ctx.api.redactor());
        if let Some(result) = &harvested {
            crate::telemetry::metrics::harvested(result.files_changed);
        }
        // The agent state after the harvest (opencode's export runs the
        // CLI, which must not race the harvest's removal of special files)
        // and before the seal, so that its event is the run's; bounded, and
        // cut by a stop, which saves it after the seal instead.
        let saved = if stopped_by.is_none() && !self.budget.stopping() {
            let save = agent_state::save(ctx, run_id, Some(&saving));
            let bounded = tokio::time::timeout(self.timings.agent_state_bound, save);
            match self.budget.unless_stopped(bounded).await {
                Some(Ok(())) => true,
                Some(Err(_)) => {
                    tracing::warn!(run_id, "the agent state's save outlived its bound; cut");
                    true
                }
                None => false,
            }
        } else {
            false
        };
        drop(saving);
        let stopping = stopped_by.is_some() || self.budget.stopping();
        crate::status::turn_step(crate::status::TurnStep::Flush);
        let report = self.flush(stopping).await.ok_or(Early::Stopped)?;
        self.seal(&outcome, harvested, &report).await?;
        self.complete().await?;
        if !saved && self.budget.stopping() {
            // What the stop budget leaves after the seal: never before it.
            self.budget
                .bounded(agent_state::save(ctx, run_id, None))
                .await;
        }
        Ok(outcome)
    }

    /// Undoes what is left and says how the turn ended.
    async fn end(mut self, steps: Result<TurnOutcome, Early>) -> Result<TurnEnd, TurnFatal> {
        self.release().await;
        // Every step that opens the sink flushes it today; a step added
        // later that ends the turn in between still delivers its events.
        if self.events.is_some() {
            let stopping = self.budget.stopping();
            self.flush(stopping).await;
        }
        match steps {
            Ok(_) if self.budget.stopping() => Ok(TurnEnd::Stopped(self.budget.current())),
            Ok(outcome) => Ok(TurnEnd::Sealed(outcome)),
            Err(Early::StoppedBeforeAck) => {
                self.remove_run_dir();
                Ok(TurnEnd::Stopped(self.budget.current()))
            }
            Err(Early::Stopped) => Ok(TurnEnd::Stopped(self.budget.current())),
            Err(Early::Failed(reason)) => Err(TurnFatal {
                events_delivered: self.events_delivered,
                ..fatal(
                    self.run_id,
                    reason,
                    std::mem::replace(&mut self.seal, SealState::NotSent),
                )
            }),
        }
    }

    /// Step 1: writes `task.txt` and the bearer file, with a bearer pulled
    /// first unless the current one outlasts the idle refresh lead; returns
    /// the task file's path. With the agent API proxy the bearer file holds
    /// the turn's proxy token, issued here (and revoked by
    /// [`Turn::remove_bearer`]), not the bearer.
    async fn write_files(&mut self, prompt: &str) -> Result<PathBuf, Early> {
        let api = &self.ctx.api;
        let task_path = self
            .run_dir
            .write_task(prompt, self.ctx.agent.user.as_ref())
            .map_err(|e| Early::Failed(e.to_string()))?;
        if let Some(text) = &self.ctx.instructions {
            let file = self
                .run_dir
                .write_instructions(text, self.ctx.agent.user.as_ref())
                .map_err(|e| Early::Failed(e.to_string()))?;
            self.instructions = Some(crate::agent::Instructions {
                text: text.clone(),
                file,
            });
        }
        let fresh = match api.bearer() {
            Some(b) if !b.expires_within(self.timings.idle_refresh_lead) => Some(Ok(b)),
            _ => {
                self.budget
                    .unless_stopped(api.pull_bearer(Policy::AGENT_TOKEN_REFRESH))
                    .await
            }
        };
        // A stop before the turn was acknowledged: the run stays for the
        // next sandbox.
        let bearer = fresh
            .ok_or(Early::StoppedBeforeAck)?
            .map_err(|e| Early::Failed(e.to_string()))?;
        // The agent pre-started for this turn is this turn's, while its
        // leader runs (the turn then discards it): what is left in the
        // session of one that died goes now.
        let spare = crate::concurrency::lock(&self.ctx.prestarted)
            .as_ref()
            .filter(|p| p.running())
            .map(drive::Prestarted::pid);
        leftovers_gone(spare).await.map_err(Early::Failed)?;
        let token = match &self.ctx.agent_api {
            AgentApi::Bearer => bearer.token,
            AgentApi::Proxy(proxy) => proxy
                .issue(self.run_id)
                .map_err(|e| Early::Failed(e.to_string()))?,
        };
        // Set before the write: a failed write still revokes the token.
        self.bearer_written = true;
        if let Some(broker) = &self.ctx.broker {
            broker.open_socket(true);
        }
        self.ctx
            .session_dir
            .write_bearer(&token)
            .map_err(|e| Early::Failed(e.to_string()))?;
        Ok(task_path)
    }

    /// Step 2: `turn_started`, then `run_started`.
    async fn acknowledge(&mut self) -> Result<(), Early> {
        let api = &self.ctx.api;
        let run_id = self.run_id;
        match self
            .budget
            .unless_stopped(api.post_status(BootStatus::TurnStarted, Some(run_id), None))
            .await
        {
            None => return Err(Early::StoppedBeforeAck),
            Some(Err(e)) => {
                return Err(Early::Failed(format!(
                    "turn_started was not acknowledged: {e}"
                )));
            }
            Some(Ok(())) => {}
        }
        crate::telemetry::metrics::turn_started();
        // From here on a stop seals the run `interrupted` (4.4): a stop
        // during `run_started` goes on to the seal.
        if let Some(Err(e)) = self.budget.unless_stopped(api.run_started(run_id)).await {
            return Err(Early::Failed(format!(
                "run_started was not acknowledged: {e}"
            )));
        }
        Ok(())
    }

    /// Opens the run's event spool (resumed if a killed runner left one);
    /// returns a sender for the steps up to the harvest.
    async fn open_events(&mut self) -> Result<EventSender, Early> {
        let sink = EventSink::open(self.ctx.api.clone(), &self.run_dir, self.run_id)
            .await
            .map_err(|e| Early::Failed(e.to_string()))?;
        let sender = sink.sender();
        self.events = Some(sink);
        Ok(sender)
    }

    /// Step 3: starts the rotation, emits the runner's first events and moves
    /// the workspace to the remote's session branch (what the user pushed
    /// between turns); returns where the harvest counts from.
    async fn before_agent(&mut self, events: &EventSender) -> Option<String> {
        let ctx = self.ctx;
        let bearer_file = match ctx.agent_api {
            AgentApi::Bearer => Some(ctx.session_dir.clone()),
            AgentApi::Proxy(_) => None,
        };
        self.rotation = Some(Rotation::start(ctx.api.clone(), bearer_file));
        self.runner_event = Some(drive::emit_runner_event(
            &ctx.agent,
            &ctx.agent_session,
            &ctx.agent_env,
            &ctx.repo_dir,
            events,
        ));
        if let Some(recovered) = crate::concurrency::lock(&ctx.recovered_at_boot).take() {
            workspace_steps::emit(events, &recovered);
        }
        if let Some(completion) = crate::concurrency::lock(&ctx.completion).take() {
            events.emit(RunnerEvent::Workspace, completion.event_data());
        }

        // The sync comes before the watch's first read, so that an interrupt
        // requested meanwhile still keeps the agent from starting.
        let sync = workspace_steps::before_turn(&ctx.harvester, self.run_id, &self.timings, events);
        // On a stop the sync goes on in the background; the harvest waits
        // for it and counts from the remote's session branch.
        let report = self.budget.unless_stopped(sync).await?;
        if report.local_sha != report.start_sha {
            // The CLI started ahead of the turn read a work tree (its
            // CLAUDE.md, settings, MCP configuration) that is no more.
            discard_prestarted(
                ctx,
                "the workspace sync changed the work tree it was started in",
            )
            .await;
        }
        // Before the boot's first agent (the CLI reads its state when it
        // starts); a stop meanwhile leaves it, and the agent never starts.
        self.budget
            .unless_stopped(agent_state::restore(ctx, events))
            .await;
        report.start_sha
    }

    /// Steps 3–4: the watch's first read; unless it (or a stop) asks to
    /// interrupt, the watch and the agent. Returns the outcome and the stop
    /// that ended the agent, if one did.
    // long: steps 3-4 of 4.1 in order (the watch's first read, the setup,
    // the deferred egress check, the agent), which share one request channel,
    // the stop and the watch's state.
    async fn run_agent(
        &mut self,
        input: &TurnInput,
        task_path: PathBuf,
        events: &EventSender,
    ) -> (TurnOutcome, Option<Stop>) {
        let ctx = self.ctx;
        let run_id = self.run_id;
        // Deferred (a setup may run): taken after setup below.
        if !ctx.egress_canary.is_deferred()
            && let Some(failed) = self.egress_canary(events).await
        {
            return (failed, None);
        }
        let mut poll = LongPoll::new();
        let (stopped_by, first_read) = if self.budget.stopping() {
            (Some(self.budget.current()), Ok(true))
        } else {
            let read =
                watch::interrupt_requested(&ctx.api, &self.watch_source(), run_id, &mut poll).await;
            (None, read)
        };
        let over_cap = match first_read {
            Ok(true) => {
                tracing::info!(
                    run_id,
                    "interrupt or stop requested before the agent started; not starting it"
                );
                let outcome = TurnOutcome {
                    agent_session_id: ctx.agent_session.resume_id(),
                    ..TurnOutcome::interrupted()
                };
                return (outcome, stopped_by);
            }
            Ok(false) => false,
            Err(e) if e.over_cap => {
                watch::log_over_cap(run_id, &e);
                true
            }
            Err(e) => {
                tracing::warn!(run_id, error = %e, "first interrupt watch read failed; starting the agent anyway");
                false
            }
        };
        // `request_tx` lives until the agent ended: its requests channel
        // stays open whether or not the watch fired.
        let (request_tx, mut request_rx) = mpsc::unbounded_channel();
        let tx = request_tx.clone();
        self.watch = Some(watch::spawn(
            ctx.api.clone(),
            self.watch_source(),
            run_id.to_string(),
            over_cap,
            poll,
            move || {
                let _ = tx.send(RunRequest::Interrupt);
            },
        ));
        if let Some(setup) = &ctx.setup {
            let run = setup::SetupRun {
                repo_dir: &ctx.repo_dir,
                user: ctx.agent.user.as_ref(),
                env: &ctx.agent_env,
                events,
                redactor: ctx.api.redactor(),
                supervision: &ctx.supervision,
                timings: &self.timings,
                harvester: &ctx.harvester,
            };
            match setup
                .before_first_agent(run, &mut request_rx, self.stop)
                .await
            {
                setup::SetupEnd::Ready => {}
                setup::SetupEnd::Failed(message) => {
                    let outcome = TurnOutcome::failed(ErrorCode::SetupFailed, message);
                    return (outcome, None);
                }
                setup::SetupEnd::Interrupted => {
                    let outcome = TurnOutcome {
                        agent_session_id: ctx.agent_session.resume_id(),
                        ..TurnOutcome::interrupted()
                    };
                    let stopped_by = self.budget.stopping().then(|| self.budget.current());
                    return (outcome, stopped_by);
                }
            }
        }
        if ctx.egress_canary.is_deferred()
            && let Some(failed) = self.egress_canary(events).await
        {
            return (failed, None);
        }
        // The agent's span: its trace context is the agent's (issue 40).
        let span = tracing::info_span!("agent", agent = ctx.agent.name());
        let turn_file = self.turn_file(input, task_path, &span);
        if let Err(e) = ctx.session_dir.write_turn(&turn_file) {
            let message = format!("cannot write the turn file: {e}");
            return (TurnOutcome::failed(ErrorCode::RunnerError, message), None);
        }
        let input = DriveInput {
            config: ctx.agent.clone(),
            session: ctx.agent_session.clone(),
            prompt: input.prompt.clone(),
            cwd: ctx.repo_dir.clone(),
            env: self.agent_env(&turn_file, &span),
            events: events.clone(),
            redactor: ctx.api.redactor().clone(),
            timings: self.timings,
            supervision: ctx.supervision.clone(),
            instructions: cli_instructions(ctx).or_else(|| self.instructions.clone()),
            prestarted: std::sync::Mutex::new(crate::concurrency::lock(&ctx.prestarted).take()),
        };
        let driven = drive::run(input, &mut request_rx, self.stop)
            .instrument(span)
            .await;
        drop(request_tx);
        (driven.outcome, driven.stopped_by)
    }

    /// The egress canary's report, for the boot's first agent only (later
    /// turns find it taken): reported as a `hosted_boot.egress_canary`
    /// event; reachable, the turn's failed outcome (`egress_policy_missing`),
    /// and no agent starts. A stop while it is awaited leaves the report to
    /// the caller's stop check.
    async fn egress_canary(&mut self, events: &EventSender) -> Option<TurnOutcome> {
        let report = self
            .budget
            .unless_stopped(self.ctx.egress_canary.take())
            .await??;
        events.emit(RunnerEvent::EgressCanary, report.event_data());
        if !report.reachable {
            return None;
        }
        Some(TurnOutcome {
            agent_session_id: self.ctx.agent_session.resume_id(),
            ..TurnOutcome::failed(
                crate::wire::ErrorCode::EgressPolicyMissing,
                report.failure_message(),
            )
        })
    }

    /// Where the interrupt watch takes its bearer: the bearer file holds it
    /// only in bearer mode.
    fn watch_source(&self) -> watch::BearerSource {
        match self.ctx.agent_api {
            AgentApi::Bearer => watch::BearerSource::File(self.ctx.session_dir.bearer_path()),
            AgentApi::Proxy(_) => watch::BearerSource::Current,
        }
    }

    /// What only this turn knows (PROTOCOL.md section 3, `turn.json`); the
    /// deadline is the time cap from now, just before the agent starts, so
    /// it is never later than the cap that stops the agent.
    fn turn_file(&self, input: &TurnInput, task_path: PathBuf, span: &tracing::Span) -> TurnFile {
        let deadline = self.ctx.supervision.time_cap.map(|cap| {
            humantime::format_rfc3339_seconds(std::time::SystemTime::now() + cap).to_string()
        });
        TurnFile {
            run_id: self.run_id.to_string(),
            ordinal: input.ordinal,
            task_file: task_path,
            instructions_file: self.instructions.as_ref().map(|i| i.file.clone()),
            deadline,
            trace_context: crate::telemetry::agent_context(span)
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        }
    }

    /// The agent's environment with the turn's variables: the turn file's
    /// path, and for a cold start its values too.
    fn agent_env(&self, turn: &TurnFile, span: &tracing::Span) -> Vec<(OsString, OsString)> {
        let mut env = boot_wide_env(self.ctx);
        for (name, value) in crate::telemetry::agent_context(span) {
            env.push((name.into(), value.into()));
        }
        env.push(("ORIZU_TASK_FILE".into(), turn.task_file.clone().into()));
        env.push(("ORIZU_RUN_ID".into(), self.run_id.into()));
        if let Some(deadline) = &turn.deadline {
            env.push(("ORIZU_TURN_DEADLINE".into(), deadline.into()));
        }
        if let Some(file) = &turn.instructions_file {
            env.push((
                crate::agent::INSTRUCTIONS_FILE_VAR.into(),
                file.clone().into(),
            ));
        }
        env
    }

    /// Stops the watch and the rotation, then removes the bearer file.
    /// Idempotent.
    async fn release(&mut self) {
        if let Some(task) = self.watch.take() {
            task.abort();
            let _ = task.await;
        }
        if let Some(rotation) = self.rotation.take() {
            rotation.stop().await;
        }
        self.remove_bearer();
    }

    /// Revokes the turn's proxy token (the agent's processes are gone, or
    /// the turn is being dropped), then removes the bearer file.
    fn remove_bearer(&mut self) {
        if let Some(broker) = &self.ctx.broker {
            broker.open_socket(false);
        }
        if self.bearer_written
            && let Some(proxy) = self.ctx.agent_api.proxy()
        {
            proxy.revoke();
        }
        if std::mem::take(&mut self.bearer_written)
            && let Err(e) = self.ctx.session_dir.remove_bearer()
        {
            tracing::error!(error = %e, "cannot remove the bearer file");
        }
        if let Err(e) = self.ctx.session_dir.remove_turn() {
            tracing::error!(error = %e, "cannot remove the turn file");
        }
    }

    fn remove_run_dir(&self) {
        if let Err(e) = self.run_dir.remove() {
            tracing::warn!(run_id = self.run_id, error = %e, "cannot remove the run directory");
        }
    }

    /// Step 6: harvests the agent's work (4.5). A stop that came after the agent
    /// ended keeps the outcome ("the seal in progress keeps its status") but
    /// gets the stop's bounds: one attempt each, within the stop budget; a
    /// second signal skips what is left. Takes the turn's last event sender:
    /// the flush ends early only once every sender is gone.
    async fn harvest(
        &mut self,
        status: RunOutcome,
        start: Option<String>,
        events: EventSender,
    ) -> Option<HarvestResult> {
        workspace_steps::after_turn(
            &self.ctx.harvester,
            self.run_id,
            status,
            start,
            &self.timings,
            self.stop,
            &events,
        )
        .instrument(tracing::info_span!("harvest"))
        .await
    }

    /// Flushes the run's events within the flush deadline (the stop's when
    /// `stopping`). `None`: the stop cut it short, or no sink is open.
    async fn flush(&mut self, stopping: bool) -> Option<FlushReport> {
        let sink = self.events.take()?;
        let deadline = if stopping {
            self.timings.stop_flush
        } else {
            self.timings.event_flush_deadline
        };
        self.budget.bounded(sink.close(deadline)).await
    }

    /// One attempt per call once a stop was requested (4.4).
    fn policy(&self) -> Policy {
        if self.budget.stopping() {
            Policy::ONCE
        } else {
            Policy::REQUIRED
        }
    }

    /// Seals the run (`finish`), then removes the run directory if every
    /// event was delivered.
    async fn seal(
        &mut self,
        outcome: &TurnOutcome,
        result: Option<HarvestResult>,
        report: &FlushReport,
    ) -> Result<(), Early> {
        let run_id = self.run_id;
        let mut body = finish_body(outcome, result);
        report.record_in(&mut body.error);
        let policy = self.policy();
        match self
            .budget
            .bounded(self.ctx.api.finish(run_id, &body, policy))
            .await
        {
            None => return Err(Early::Stopped),
            Some(Err(e)) if self.budget.stopping() => {
                tracing::error!(run_id, error = %e, "finish failed during the graceful stop");
                return Err(Early::Stopped);
            }
            Some(Err(e)) => {
                self.seal = if e.verdict_status().is_some() {
                    SealState::Refused(body)
                } else {
                    SealState::Unknown(body)
                };
                self.events_delivered = report.undelivered() == 0;
                return Err(Early::Failed(format!("finish was not acknowledged: {e}")));
            }
            Some(Ok(())) => self.seal = SealState::Sealed,
        }
        self.log_summary(&body, report);
        if report.undelivered() == 0 {
            self.remove_run_dir();
        }
        Ok(())
    }

    /// The turn in one line for people (`wire::summary`), with the seal's
    /// facts as fields for a log pipeline.
    fn log_summary(&self, body: &FinishBody, report: &FlushReport) {
        let took = self.started.elapsed();
        let facts = crate::wire::summary::TurnFacts {
            ordinal: self.ordinal,
            run_id: self.run_id,
            events: report.last_seq,
            undelivered: report.undelivered(),
            took: Some(took),
        };
        let result = body.result.as_ref();
        tracing::info!(
            target: crate::logging::TURN_SUMMARY_TARGET,
            run_id = self.run_id,
            ordinal = self.ordinal,
            status = body.status.as_str(),
            error = body.error.as_ref().map(|e| e.code.as_str()),
            took_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
            events = report.last_seq,
            undelivered = report.undelivered(),
            head = result.and_then(|r| r.head_sha.as_deref()),
            pushed = result.map(|r| r.pushed),
            commits = result.map(|r| r.commits),
            "{}",
            crate::wire::summary::turn_line(&facts, body)
        );
    }

    /// `turn_completed`; during a graceful stop a failure is only logged.
    async fn complete(&mut self) -> Result<(), Early> {
        let run_id = self.run_id;
        let policy = self.policy();
        let completed =
            self.ctx
                .api
                .post_status_with(BootStatus::TurnCompleted, Some(run_id), None, policy);
        match self.budget.bounded(completed).await {
            None => Err(Early::Stopped),
            Some(Err(e)) if self.budget.stopping() => {
                tracing::error!(run_id, error = %e, "turn_completed failed during the graceful stop");
                Ok(())
            }
            Some(Err(e)) => Err(Early::Failed(format!(
                "turn_completed was not acknowledged: {e}"
            ))),
            Some(Ok(())) => Ok(()),
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        // Only a turn that never reached `end` has anything left here.
        if let Some(task) = self.watch.take() {
            task.abort();
        }
        if let Some(rotation) = self.rotation.take() {
            rotation.cancel();
        }
        self.remove_bearer();
    }
}

fn finish_body(outcome: &TurnOutcome, result: Option<HarvestResult>) -> FinishBody {
    FinishBody {
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
        result,
        agent_session_reset: outcome.session_reset.clone(),
        resources: outcome.resources.clone(),
    }
}
