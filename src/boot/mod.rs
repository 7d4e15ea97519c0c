//! The boot of PROTOCOL.md section 4, in order. This is the only module that
//! knows the order of the steps; each step is a function that takes what it
//! needs and returns what the next one needs. It owns the session
//! directory's life and the reporting on every exit path (step 7).

pub mod config;
pub mod environment;
mod error;
pub mod idle;
pub mod on_stop;
pub mod secret_env;
pub mod secret_file;
pub mod values;

use std::collections::HashSet;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use reqwest::Url;
use tokio::sync::watch;
use tracing::Instrument;

use crate::agent_api::{AgentApi, AgentApiMode, ApiProxy};
use crate::client::{Api, Policy, RepoToken};
use crate::process::supervisor::Supervision;
use crate::redact::Redactor;
use crate::session_dir::{self, BootContext, CredentialMode, SessionDir, SessionDirError};
use crate::signals::{self, Stop, unless_stopped};
use crate::status::{Phase, StatusFile};
use crate::turn::{self, SealState, TurnContext, TurnEnd, TurnFatal, TurnInput};
use crate::validate;
use crate::wire::{
    Access, BootStatus, ErrorCode, FinishBody, FinishError, HarvestResult, RunOutcome, Session,
};
use crate::workspace::{self, HarvestJob, Harvester, WorkspaceError};
use config::BootConfig;
use error::BootError;
use idle::IdleEnd;

/// How the boot ended, before reporting (step 7).
#[derive(Debug)]
enum Ending {
    /// The session ended: `complete`, exit 0.
    Clean,
    /// A stop signal (4.4): nothing posted, exit 128+N.
    Stopped(Stop),
    /// Fatal before the drain began: `failed`, exit 1.
    BeforeDrain(BootError),
    /// Between turns, a session whose next turn cannot be read
    /// (`session_too_large`): `failed`, exit 1. The last run is sealed and
    /// acknowledged already, and the next one was never read, so there is
    /// no run to seal or to name in `turn_failed` (PROTOCOL.md 4 step 7).
    Unreadable(BootError),
    /// Fatal once the drain began: seal if needed, `turn_failed`, exit 1
    /// (boxed: an ending is passed up through every step's `Err`).
    InDrain(Box<FatalInDrain>),
    /// The runner leaves its sandbox, idle or retired (PROTOCOL.md 4.2,
    /// "Leaving the sandbox"), its work harvested; whether the coordinator
    /// accepts `released`. The report posts it (after the on-stop hook):
    /// acknowledged, exit 0; not, exit 1; not accepted, nothing is posted
    /// and the exit is 75.
    Left(idle::Leave, bool),
}

/// A fatal error once the drain began (PROTOCOL.md 4 step 7).
#[derive(Debug)]
struct FatalInDrain {
    /// The run, why, its seal, and whether its events are known to be
    /// delivered (see [`remove_run_dir_if_delivered`]).
    fatal: TurnFatal,
    /// The harvest of the fatal path (4 step 7), for an unsealed run.
    harvest: Option<HarvestResult>,
}

impl<E: Into<BootError>> From<E> for Ending {
    fn from(e: E) -> Ending {
        Ending::BeforeDrain(e.into())
    }
}

/// A step's result: `Err` ends the boot there, with that ending (a clean
/// end or a stop as well as a failure), reported by [`Cleanup::finish`].
type Step<T> = Result<T, Ending>;

/// Runs the boot and returns the process exit code: 0 clean end, 1 failure
/// after reporting it, 128+N stopped by signal N.
pub async fn run(config: BootConfig) -> i32 {
    let redactor = Redactor::new();
    let telemetry = crate::telemetry::Telemetry::from_env(&redactor);
    let _log = crate::logging::init(
        config.log_format,
        redactor.clone(),
        telemetry.telemetry.as_ref(),
    );
    for problem in &telemetry.problems {
        tracing::warn!("telemetry: {problem}");
    }
    let telemetry = telemetry.telemetry;
    warn_of_settings(&config);
    // The kernel's OOM killer takes the agent, not the runner (4.1 step 4).
    match crate::process::oom::protect_runner() {
        Ok(()) => tracing::debug!(
            oom_score_adj = crate::process::oom::RUNNER,
            "the runner's oom_score_adj lowered"
        ),
        Err(e) => tracing::info!(
            error = %e,
            oom_score_adj = %crate::process::oom::current()
                .map_or_else(|| "unknown".to_string(), |v| v.to_string()),
            "cannot lower the runner's oom_score_adj (needs CAP_SYS_RESOURCE); it keeps its score, the agent's is raised"
        ),
    }
    let http = match crate::tls::http_client(config.ca_file.as_deref()) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("hosted-boot: configuration error: {e:#}");
            return 2;
        }
    };
    if let Some(telemetry) = &telemetry {
        telemetry.connect(&http);
    }
    let stop = match signals::listen() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("hosted-boot: {e}");
            return 1;
        }
    };
    // Early: a notice before its handler is installed would end the runner
    // (SIGUSR1's default action).
    let checkpoints = match signals::listen_checkpoints() {
        Ok(requests) => crate::turn::checkpoint::Notices::new(requests),
        Err(e) => {
            tracing::warn!(error = %e, "checkpoint notices are not answered");
            crate::turn::checkpoint::Notices::none()
        }
    };
    enable_status_line(&config);
    let status = StatusFile::create(&config.root, &config.api.session_id);
    let mut cleanup = Cleanup::new(status.clone());
    cleanup.on_stop = config
        .on_stop
        .clone()
        .map(|hook| on_stop::Hook::new(hook, &config, supervision(&config, None)));
    let api = client(&config, http.clone(), &redactor, &status);
    tracing::info!(
        session_id = %config.api.session_id,
        agent = config.agent.name(),
        version = env!("CARGO_PKG_VERSION"),
        "boot starting"
    );
    let mut boot = Boot {
        config: &config,
        api,
        http,
        redactor,
        stop,
        status,
        checkpoints,
    };
    // The whole boot, its report included, is one span: the trace of the
    // sandbox's `TRACEPARENT` when the platform gives one.
    let span = tracing::info_span!("boot", session_id = %config.api.session_id, exit_code = tracing::field::Empty);
    if let Ok(parent) = std::env::var(crate::telemetry::TRACEPARENT_VAR) {
        let state = std::env::var(crate::telemetry::TRACESTATE_VAR).ok();
        crate::telemetry::continue_trace(&span, &parent, state.as_deref());
    }
    let code = async {
        let ending = steps(&mut boot, &mut cleanup)
            .await
            .unwrap_or_else(|ending| ending);
        let code = cleanup.finish(&mut boot, ending).await;
        tracing::Span::current().record("exit_code", code);
        code
    }
    .instrument(span)
    .await;
    // After everything the stop budget bounds, within its own bound.
    if let Some(telemetry) = telemetry {
        telemetry.shutdown().await;
    }
    code
}

fn warn_of_settings(config: &BootConfig) {
    if config.agent.acp_permissions == crate::agent::AcpPermissions::Reject
        && config.agent.kind != crate::agent::AgentKind::Acp
    {
        tracing::warn!(
            agent = config.agent.name(),
            "--acp-permissions reject applies to --agent acp only; this agent's CLI runs in its own unattended mode"
        );
    }
    if config.time_scale != 1.0 {
        tracing::warn!(
            scale = config.time_scale,
            "HOSTED_BOOT_TEST_TIME_SCALE is set: every contract duration is scaled (for tests only)"
        );
    }
    if config.insecure_http {
        tracing::warn!("HOSTED_BOOT_INSECURE_HTTP=1: plain http is accepted for any host");
    }
}

/// The one-line status on stderr, for people: with text logs (the default
/// on a terminal).
fn enable_status_line(config: &BootConfig) {
    let format =
        config
            .log_format
            .unwrap_or(if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                crate::logging::LogFormat::Text
            } else {
                crate::logging::LogFormat::Json
            });
    crate::status_line::enable(format == crate::logging::LogFormat::Text);
}

/// The coordinator client; every contact is recorded in the status file.
fn client(
    config: &BootConfig,
    http: reqwest::Client,
    redactor: &Redactor,
    status: &StatusFile,
) -> Arc<Api> {
    let contact = status.clone();
    Arc::new(
        Api::new(config.api.clone(), http, config.timings, redactor.clone())
            .with_contact_hook(Arc::new(move |ok| contact.contact(ok))),
    )
}

/// Records how a turn ended on its span and in the metrics.
fn turn_ended(span: &tracing::Span, took: std::time::Duration, ended: &Result<TurnEnd, TurnFatal>) {
    let (outcome, code) = match ended {
        Ok(TurnEnd::Sealed(outcome)) => (
            outcome.status.as_str(),
            outcome.error.as_ref().map(|e| e.code.as_str()),
        ),
        Ok(TurnEnd::Stopped(_)) => ("stopped", None),
        Err(_) => ("fatal", None),
    };
    span.record("outcome", outcome);
    if let Some(code) = code {
        span.record("error_code", code);
    }
    if matches!(outcome, "failed" | "fatal") {
        span.record("otel.status_code", "ERROR");
    }
    crate::telemetry::metrics::turn_ended(took, outcome, code);
}

/// What every step of the boot shares.
struct Boot<'a> {
    config: &'a BootConfig,
    api: Arc<Api>,
    /// The runner's HTTP client (one TLS stack), for git too.
    http: reqwest::Client,
    redactor: Redactor,
    stop: watch::Receiver<Stop>,
    status: StatusFile,
    checkpoints: crate::turn::checkpoint::Notices,
}

/// Step 7's cleanup, one for every exit path: the status file's heartbeat
/// stops, the ending is reported, then the bearer file and the session
/// directory go, last, since the credential helper and its context live
/// there (PROTOCOL.md 3, 4 step 7). Dropped without [`Cleanup::finish`] (a
/// panic), it still removes the session directory.
struct Cleanup {
    status: StatusFile,
    heartbeat: tokio::task::JoinHandle<()>,
    session_dir: Option<Arc<SessionDir>>,
    /// Broker mode: the credential broker's socket, served until the
    /// session directory goes.
    broker: Option<workspace::BrokerServer>,
    /// `--on-stop-script`: run before the report, once the session
    /// directory is gone.
    on_stop: Option<on_stop::Hook>,
}

impl Cleanup {
    /// Starts the status file's heartbeat.
    fn new(status: StatusFile) -> Cleanup {
        let beating = status.clone();
        let heartbeat = tokio::spawn(async move {
            loop {
                tokio::time::sleep(crate::status::TICK).await;
                beating.tick();
            }
        });
        Cleanup {
            status,
            heartbeat,
            session_dir: None,
            broker: None,
            on_stop: None,
        }
    }

    /// Runs the on-stop hook for `ending` (once the session directory is
    /// gone: it never sees a secret file), reports `ending` (step 7),
    /// removes the session directory and returns the exit code.
    async fn finish(mut self, b: &mut Boot<'_>, ending: Ending) -> i32 {
        self.status.phase(Phase::Stopping, None, None);
        if let Some(hook) = self.on_stop.take()
            && let Some(why) = on_stop_ending(&ending)
        {
            self.remove_session_dir();
            let ran = hook
                .run(why, &mut b.stop, &b.redactor)
                .instrument(tracing::info_span!(
                    "step",
                    step = "on_stop",
                    otel.name = "on_stop"
                ))
                .await;
            self.status.on_stop(ran);
        }
        self.heartbeat.abort();
        let (code, reason) = bounded_report(b, ending).await;
        self.remove_session_dir();
        self.status.exited(code, &reason);
        tracing::info!(exit_code = code, reason = %reason, "boot finished");
        code
    }

    fn remove_session_dir(&mut self) {
        // The broker stops first: no token is handed out once the session
        // directory goes.
        self.broker.take();
        if let Some(dir) = self.session_dir.take() {
            if let Err(e) = dir.remove_bearer() {
                tracing::error!(error = %e, "cannot remove the bearer file");
            }
            if let Err(e) = dir.remove() {
                tracing::error!(error = %e, "cannot remove the session directory");
            }
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.heartbeat.abort();
        if !self.status.has_exited() {
            // A panic: the exit code is the panic's (101), the report none.
            self.status
                .exited(101, "the runner panicked before reporting its ending");
        }
        self.remove_session_dir();
    }
}

/// A step's fallible work, unless a stop signal comes first; its error ends
/// the boot before the drain.
async fn step<T, E: Into<BootError>>(
    stop: &mut watch::Receiver<Stop>,
    f: impl Future<Output = Result<T, E>>,
) -> Step<T> {
    match unless_stopped(stop, f).await {
        Err(s) => Err(Ending::Stopped(s)),
        Ok(result) => Ok(result?),
    }
}

/// Steps 2 to 6 of PROTOCOL.md 4 (step 1 is the configuration's, step 7
/// [`Cleanup`]'s), each a function that takes what it needs and returns what
/// the next one needs.
async fn steps(b: &mut Boot<'_>, cleanup: &mut Cleanup) -> Step<Ending> {
    let session_dir = create_session_dir(b.config)?;
    cleanup.session_dir = Some(session_dir.clone());
    // Step 2: the agent bearer.
    let policy = Policy::AGENT_TOKEN_BOOT;
    step(&mut b.stop, b.api.pull_bearer(policy)).await?;
    // Step 3: env bundle, session, read repo token, concurrently.
    let resolved = step(&mut b.stop, resolve(b.config, &b.api, &b.redactor)).await?;
    if let Some(hook) = &mut cleanup.on_stop {
        hook.with_bundle(&resolved.bundle);
    }
    // The egress canary, in the background from here to the first agent.
    let egress_canary = start_egress_canary(b.config, &resolved)?;
    // Steps 3 (the leftovers) and 4: the first turn, waited for if need be.
    let mut done = HashSet::new();
    let leave = leave_at(b.config, &resolved.session);
    let first = first_turn(b, &resolved.session, &done, leave).await?;
    // Step 5: session files, credential helper, clone.
    let workspace = prepare_workspace(b, &session_dir, &resolved, cleanup).await?;
    // What the clone freed goes back to the kernel, beside the turn's set-up
    // (not at a turn's start: glibc's fork, the agent's, waits for a trim).
    drop(tokio::task::spawn_blocking(trim_heap));
    // Step 6: drain turns.
    let instructions = instructions(b.config, &resolved.session)?;
    let instructions_file = match &instructions {
        Some(text) => Some(session_dir.write_instructions(text)?),
        None => None,
    };
    let ctx = turn_context(b, session_dir, resolved, workspace, egress_canary)?;
    let ctx = TurnContext {
        instructions,
        instructions_file,
        ..ctx
    };
    crate::agent::drive::start_version_probe(
        &ctx.agent,
        &ctx.agent_session,
        &ctx.agent_env,
        &ctx.repo_dir,
    );
    Ok(drain(&ctx, first, &mut done, &mut b.stop, &b.status, leave).await)
}

/// Returns the free pages of glibc's heaps to the kernel (`malloc_trim`).
/// glibc keeps what is freed mapped, so a runner's private memory would
/// stay at its peak (the clone's pack buffers, a turn's output) through
/// the idle hours between turns: the idle heap 0.75 MiB instead of 1.17
/// (BENCHMARKS.md, "The boot's targets").
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases memory glibc's allocator holds free,
    // under its own arena locks; it takes no pointer.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Leaves for `why`: the report posts `released` to a coordinator that
/// accepts it (after the on-stop hook; a stop meanwhile cuts the post),
/// nothing to one that does not.
fn release(why: idle::Leave, leave: idle::LeaveAt) -> Ending {
    Ending::Left(why, leave.accepts_released)
}

/// What the on-stop hook is told of `ending`; `None`: it does not run (an
/// immediate stop: a second signal skips all but the file removal, 4.4).
/// A failure runs it too: it is the sandbox's cleanup, as a CI runner's
/// job-completed hook runs after a failed job.
fn on_stop_ending(ending: &Ending) -> Option<on_stop::BootEnding> {
    use on_stop::BootEnding;
    match ending {
        Ending::Clean => Some(BootEnding::Complete),
        Ending::Left(idle::Leave::Idle, _) => Some(BootEnding::Idle),
        Ending::Left(idle::Leave::Retired, _) => Some(BootEnding::Retired),
        Ending::Stopped(Stop::Graceful(_)) => Some(BootEnding::Stopped),
        Ending::Stopped(_) => None,
        Ending::BeforeDrain(_) | Ending::Unreadable(_) | Ending::InDrain(_) => {
            Some(BootEnding::Failed)
        }
    }
}

/// The exit code of a runner that left its sandbox (retired) without
/// telling the coordinator, which does not accept `released`: 75
/// (`EX_TEMPFAIL`), not 0, so that a platform tells it from a session that
/// ended.
const EXIT_LEFT_UNRELEASED: i32 = 75;

/// When a wait for a turn ends with none (PROTOCOL.md 4.2, "Leaving the
/// sandbox"): `--release-idle-after` only with a coordinator that accepts
/// `released` (said once otherwise), and the retirement.
fn leave_at(config: &BootConfig, session: &Session) -> idle::LeaveAt {
    let idle_after = match config.release_idle_after {
        Some(after) if session.accepts_released => Some(after),
        Some(_) => {
            tracing::warn!(
                "--release-idle-after is ignored: the coordinator's session does not say acceptsReleased (PROTOCOL.md 2.4), and a runner that left would strand the session"
            );
            None
        }
        None => None,
    };
    idle::LeaveAt {
        idle_after,
        retire_at: config.retire_at,
        accepts_released: session.accepts_released,
    }
}

/// The session directory. One left by a SIGKILLed boot goes before anything
/// else (creating ours removes it), so no stale bearer or secret outlives
/// it.
fn create_session_dir(config: &BootConfig) -> Step<Arc<SessionDir>> {
    let dir = SessionDir::create(&config.root, &config.api.session_id)?;
    let dir = match &config.agent_user {
        // In file mode the agent's git runs the helper, which reads
        // `boot-secret`, as the agent user; in broker mode the secret's
        // files stay the runner's.
        Some(user) => dir.for_agent_user(user, config.credential_mode == CredentialMode::File)?,
        None => dir,
    };
    Ok(Arc::new(dir))
}

/// The end of step 3 and step 4: selects the first turn (2.4), delivers
/// what earlier boots left undelivered, and, with nothing to run yet, posts
/// `ready` and waits for a turn (4.2).
async fn first_turn(
    b: &mut Boot<'_>,
    session: &Session,
    done: &HashSet<String>,
    leave: idle::LeaveAt,
) -> Step<TurnInput> {
    let active = session.is_active();
    let selected = if active {
        idle::select_turn(session, true, done)?
    } else {
        None
    };
    // Events earlier boots could not deliver (PROTOCOL.md 2.6, 4 step 3),
    // before this boot runs or waits for anything, so that a boot with
    // nothing to run delivers them too. The turn about to run resumes its
    // own spool.
    let current = selected.as_ref().map_or("", |t| t.run_id.as_str());
    let leftovers = crate::events::deliver_leftovers(&b.api, &b.config.root, current);
    unless_stopped(&mut b.stop, leftovers)
        .await
        .map_err(Ending::Stopped)?;
    if !active {
        tracing::info!(
            status = session.status.as_deref().unwrap_or("active"),
            "the session is no longer active"
        );
        return Err(Ending::Clean);
    }
    if leave.retired() {
        // Before the workspace: a `repo/` an earlier runner left is
        // recovered by the next sandbox's boot.
        tracing::info!("the runner's retirement has passed; it takes no turn");
        return Err(release(idle::Leave::Retired, leave));
    }
    match selected {
        Some(turn) => Ok(turn),
        None => wait_for_first_turn(b, done, leave).await,
    }
}

/// Step 4 with nothing to run: `ready` (required), then the wait of 4.2
/// under the boot's stricter failure rule.
async fn wait_for_first_turn(
    b: &mut Boot<'_>,
    done: &HashSet<String>,
    leave: idle::LeaveAt,
) -> Step<TurnInput> {
    tracing::info!("nothing to run yet; posting ready and waiting for a turn");
    let ready = async {
        b.api
            .post_status(BootStatus::Ready, None, None)
            .await
            .map_err(BootError::ReadyUnacknowledged)
    };
    step(&mut b.stop, ready).await?;
    b.status.phase(Phase::Idle, None, None);
    match idle::wait(&b.api, true, done, &mut b.stop, leave)
        .instrument(tracing::info_span!(
            "step",
            step = "idle",
            otel.name = "idle"
        ))
        .await?
    {
        IdleEnd::Turn(t) => Ok(t),
        IdleEnd::Ended => Err(Ending::Clean),
        IdleEnd::Stopped(s) => Err(Ending::Stopped(s)),
        IdleEnd::Leave(why) => Err(release(why, leave)),
    }
}

/// What step 5 leaves: `repo/` ready, and what every harvest needs.
struct Workspace {
    harvester: Harvester,
    /// The harvest of a reused `repo/`'s work (section 3), for the first
    /// turn's report.
    recovered_at_boot: Option<HarvestResult>,
    /// A fresh clone's submodules and LFS objects, for the first turn's
    /// `hosted_boot.workspace` event.
    completion: workspace::completion::Completion,
    /// The broker the socket serves (broker mode), opened to the agent's
    /// git during turns.
    served_broker: Option<workspace::Broker>,
}

/// Step 5: session files, credential helper, clone (or reuse) of `repo/`.
async fn prepare_workspace(
    b: &mut Boot<'_>,
    session_dir: &SessionDir,
    resolved: &Resolved,
    cleanup: &mut Cleanup,
) -> Step<Workspace> {
    b.status.phase(Phase::Cloning, None, None);
    // The runner's git work reads no user's global configuration, only the
    // system's and the repository's own: acting as the agent user, libgit2
    // cannot stat the runner's $HOME when it is 0700 (/root in the image:
    // "failed to stat '/root/.gitconfig'" failed every sync and harvest
    // there, issue 36), and a home the agent can write (its own, the
    // non-root variant's) could redirect the harvest's push with a
    // `url.<base>.insteadOf` or hide files from it with an excludes file.
    for level in [git2::ConfigLevel::Global, git2::ConfigLevel::XDG] {
        // SAFETY: set before any git work of this boot, while no other
        // thread uses libgit2.
        if let Err(e) = unsafe { git2::opts::set_search_path(level, "") } {
            tracing::warn!(error = %e.message(), ?level, "cannot keep libgit2 from reading the user's global git configuration");
        }
    }
    if b.config.agent_user.is_some() {
        // repo/ belongs to the agent user; libgit2 would refuse the runner
        // (root) a repository another user owns. The runner opens no other
        // repository and runs none of its hooks or filters (ARCHITECTURE.md,
        // "The harvest trusts nothing in repo/.git/config").
        // SAFETY: set before any git work of this boot, while no other
        // thread uses libgit2.
        if let Err(e) = unsafe { git2::opts::set_verify_owner_validation(false) } {
            tracing::warn!(error = %e.message(), "cannot turn libgit2's owner check off; the runner's git work in the agent user's repo/ may be refused");
        }
    }
    write_session_files(b.config, session_dir, &resolved.remote)?;
    // The runner's own git work (clone, sync, harvest) always asks the
    // broker in process, in both credential modes: it never runs the
    // credential helper, which reads boot-context.json, a file the agent
    // user can write (issue 31: in file mode a root-run helper followed the
    // agent's rewritten paths and URLs). Only broker mode serves it on the
    // socket, for the agent's git.
    let broker = new_broker(b, resolved);
    let served_broker = match b.config.credential_mode {
        CredentialMode::File => {
            b.redactor
                .add_source(issued_tokens_source(session_dir.issued_tokens_path()));
            None
        }
        CredentialMode::Broker => {
            cleanup.broker = Some(serve_broker(b, session_dir, &broker)?);
            Some(broker.clone())
        }
    };
    let broker = Some(broker);
    let harvester = harvester(
        b.config,
        b.http.clone(),
        session_dir,
        &resolved.remote,
        &resolved.session.repo_branch,
        &b.redactor,
        broker,
    )?;
    let clone = clone_repo(b.config, &harvester, session_dir).instrument(tracing::info_span!(
        "step",
        step = "clone",
        otel.name = "clone"
    ));
    // The completion of a fresh clone runs `git` for its submodules and
    // LFS objects, which asks through the socket.
    if let Some(served) = &served_broker {
        served.open_socket(true);
    }
    let cloned = step(&mut b.stop, clone).await;
    if let Some(served) = &served_broker {
        served.open_socket(false);
    }
    let (reused, completion) = cloned?;
    // A reused repo/ (section 3): its work is harvested first, which also
    // brings the local session branch to the remote's (4.5).
    let mut recovered_at_boot = None;
    if reused {
        let job = HarvestJob {
            name: workspace::RECOVERED_AT_BOOT.to_string(),
            outcome: None,
            start: None,
            bound: b.api.timings().harvest_bound,
        };
        let harvest = unless_stopped(&mut b.stop, harvester.harvest(job)).await;
        recovered_at_boot = Some(harvest.map_err(Ending::Stopped)?);
    }
    Ok(Workspace {
        harvester,
        recovered_at_boot,
        completion,
        served_broker,
    })
}

/// The uids the credential broker admits (`SO_PEERCRED`): the runner's own
/// (its transport and the helpers it starts) and, with `--agent-user`, the
/// agent user's (the agent's git runs the helper as that user).
fn broker_peers(config: &BootConfig) -> Vec<u32> {
    let mut peers = vec![rustix::process::getuid().as_raw()];
    peers.extend(config.agent_user.as_ref().map(|u| u.uid));
    peers
}

/// The credential broker, seeded with the boot's own read token (step 3)
/// so the clone mints nothing.
fn new_broker(b: &Boot<'_>, resolved: &Resolved) -> workspace::Broker {
    let broker = workspace::Broker::new(b.api.clone(), resolved.remote.clone(), b.redactor.clone());
    let seeded = broker.seed_read(&resolved.read_token, resolved.read_token_at);
    tracing::debug!(
        seeded,
        "credential broker seeded with the boot's read token"
    );
    broker
}

/// Serves `broker` on its socket in the session directory (broker mode,
/// PROTOCOL.md 3).
fn serve_broker(
    b: &Boot<'_>,
    session_dir: &SessionDir,
    broker: &workspace::Broker,
) -> Result<workspace::BrokerServer, SessionDirError> {
    let socket = session_dir.credential_socket_path();
    broker
        .serve(
            &socket,
            broker_peers(b.config),
            b.config.timings.request_timeout,
        )
        .map_err(|e| SessionDirError::io("serve the credential broker on", &socket, e))
}

/// What every turn of the drain (step 6) shares; starts the agent API
/// proxy (once per boot) in proxy mode.
fn turn_context(
    b: &Boot<'_>,
    session_dir: Arc<SessionDir>,
    resolved: Resolved,
    workspace: Workspace,
    egress_canary: crate::egress::Pending,
) -> Step<TurnContext> {
    let config = b.config;
    let client_info = &resolved.session.client_info;
    let agent_api = agent_api(b)?;
    let proxy = matches!(agent_api, AgentApi::Proxy(_));
    Ok(TurnContext {
        api: b.api.clone(),
        session_dir,
        root: config.root.clone(),
        repo_dir: config.root.join("repo"),
        agent: config.agent.clone(),
        agent_env: environment::agent_env(
            &config.base_env,
            &resolved.bundle,
            &config.api,
            &agent_api,
            client_info,
        ),
        agent_api,
        supervision: supervision(
            config,
            Supervision::time_cap_from_minutes(client_info.duration_minutes),
        ),
        agent_session: Arc::new(crate::agent::AgentSession::new(
            client_info,
            resolved.session.agent_session_id.clone(),
        )),
        harvester: workspace.harvester,
        recovered_at_boot: std::sync::Mutex::new(workspace.recovered_at_boot),
        completion: std::sync::Mutex::new(
            (!workspace.completion.is_empty()).then_some(workspace.completion),
        ),
        setup: crate::turn::setup::Setup::plan(
            &config.setup,
            resolved.session.setup.as_ref(),
            resolved.bundle.setup_only.clone(),
            &config.root,
        ),
        egress_canary,
        instructions: None,
        instructions_file: None,
        prestart_agent: prestart_allowed(config, proxy),
        broker: workspace.served_broker,
        prestarted: std::sync::Mutex::new(None),
        agent_state: crate::turn::agent_state::Carry::new(resolved.session.agent_state),
        checkpoints: b.checkpoints.clone(),
    })
}

/// How the runner supervises what it starts as a turn starts its agent (a
/// turn's agent and setup, the on-stop hook): `time_cap` for an agent.
fn supervision(config: &BootConfig, time_cap: Option<std::time::Duration>) -> Supervision {
    Supervision {
        drain: config.timings.pipe_drain,
        time_cap,
        cap_grace: config.timings.interrupt_grace,
        cgroup: config.turn_cgroup,
        guard_exe: Some(PathBuf::from("/proc/self/exe")),
        stop_signal: rustix::process::Signal::INT,
    }
}

/// `--prestart-agent`, where a CLI waiting between turns can hold no
/// credential: with the agent API proxy (the bearer file holds no bearer)
/// and the credential broker (no boot secret the agent can read; the
/// socket answers during turns only). Otherwise off, said once.
fn prestart_allowed(config: &BootConfig, proxy: bool) -> bool {
    if !config.prestart_agent {
        return false;
    }
    let why = if !proxy {
        "--agent-api bearer gives the agent a bearer"
    } else if config.credential_mode == CredentialMode::File {
        "--credential-mode file gives the agent the boot secret"
    } else {
        return true;
    };
    tracing::info!(
        "--prestart-agent is off for this boot: {why}, which a CLI started between turns would hold"
    );
    false
}

/// The platform's instructions for the agent (PROTOCOL.md 3): the
/// session's `instructions` (2.4), else `--instructions-file`'s text; an
/// empty text is none.
///
/// Errors: the file cannot be read (`workspace_io`).
/// Bound on `--instructions-file`, in bytes (1 MiB).
const MAX_INSTRUCTIONS_FILE: u64 = 1 << 20;

/// The text of `--instructions-file`: a regular file (a FIFO would block
/// the boot, a device never end) of at most [`MAX_INSTRUCTIONS_FILE`].
///
/// Errors: not a regular file, over the bound, unreadable, not UTF-8.
fn read_instructions_file(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(std::io::Error::other(
            "not a regular file: give --instructions-file a file",
        ));
    }
    if meta.len() > MAX_INSTRUCTIONS_FILE {
        return Err(std::io::Error::other(format!(
            "{} bytes, over the {MAX_INSTRUCTIONS_FILE} bytes instructions may take",
            meta.len()
        )));
    }
    let mut text = String::new();
    file.take(MAX_INSTRUCTIONS_FILE).read_to_string(&mut text)?;
    Ok(text)
}

fn instructions(config: &BootConfig, session: &Session) -> Result<Option<String>, SessionDirError> {
    let from_session = session
        .instructions
        .as_deref()
        .filter(|t| !t.trim().is_empty());
    let (text, source) = match (from_session, &config.instructions_file) {
        (Some(t), _) => (t.to_string(), "session"),
        (None, Some(path)) => (
            read_instructions_file(path)
                .map_err(|e| SessionDirError::io("read the instructions file", path, e))?,
            "--instructions-file",
        ),
        (None, None) => return Ok(None),
    };
    if text.trim().is_empty() {
        return Ok(None);
    }
    tracing::info!(
        source,
        chars = text.chars().count(),
        "instructions for the agent"
    );
    Ok(Some(text))
}

/// Starts the egress canary (PROTOCOL.md 4.1 step 3): the session's
/// `egressCanary` (2.4) or `--egress-canary`; neither: no check. An
/// `https://` canary goes through the `HTTPS_PROXY` the agent gets (the
/// runner's environment, then the env bundle's connectors).
///
/// Errors: a session value that is neither `HOST:PORT` nor `https://HOST`
/// (`invalid_value`).
fn start_egress_canary(config: &BootConfig, resolved: &Resolved) -> Step<crate::egress::Pending> {
    use crate::egress::{CANARY_TIMEOUT, Canary, CheckOptions, Pending};
    let from_session = resolved
        .session
        .egress_canary
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let (canary, source) = match from_session {
        Some(text) => (Canary::parse("session egressCanary", text)?, "session"),
        None => match &config.egress_canary {
            Some(c) => (c.clone(), "--egress-canary"),
            None => {
                tracing::debug!("no egress canary is set: no egress check");
                return Ok(Pending::none());
            }
        },
    };
    tracing::info!(canary = %canary, source, "egress canary set");
    let base = config
        .base_env
        .iter()
        .filter_map(|(k, v)| Some((k.to_str()?, v.to_str()?)));
    let connectors = resolved
        .bundle
        .connectors
        .iter()
        .map(|(k, v)| (k.as_str(), v.expose()));
    let env: Vec<(&str, &str)> = base.chain(connectors).collect();
    let opts = CheckOptions {
        ca_file: config.ca_file.clone(),
        timeout: crate::timings::scale_timeout(CANARY_TIMEOUT, config.timings.scale),
        ..CheckOptions::default()
    }
    .proxy_from(env.iter().copied());
    // A setup script may need the network the policy closes after it: the
    // check then comes after setup, in the first turn (4.1 step 3).
    let setup_set = config.setup.script.is_some()
        || resolved
            .session
            .setup
            .as_ref()
            .and_then(|s| s.script.as_deref())
            .is_some_and(|s| !s.trim().is_empty());
    if setup_set {
        return Ok(Pending::after_setup(canary, opts));
    }
    Ok(Pending::start(canary, opts))
}

/// The agent's API for every turn (`--agent-api`, PROTOCOL.md section 3).
fn agent_api(b: &Boot<'_>) -> Step<AgentApi> {
    let config = b.config;
    match config.agent_api {
        AgentApiMode::Bearer => {
            if config.agent_api_allow != crate::agent_api::Allowlist::default() {
                tracing::warn!(
                    "--agent-api-allow applies to --agent-api proxy only; with --agent-api bearer the agent calls the coordinator itself"
                );
            }
            tracing::info!("agent API: the agent gets the bearer (--agent-api bearer)");
            Ok(AgentApi::Bearer)
        }
        AgentApiMode::Proxy => {
            let proxy = ApiProxy::start(
                b.api.clone(),
                b.http.clone(),
                config.api.api_base.clone(),
                config.api.session_id.clone(),
                config.agent_api_allow.clone(),
            )
            .map_err(BootError::from)?;
            Ok(AgentApi::Proxy(Arc::new(proxy)))
        }
    }
}

/// Step 6: runs turns (4.1) and waits between them (4.2) until the session
/// ends or a turn is fatal.
async fn drain(
    ctx: &TurnContext,
    first: TurnInput,
    done: &mut HashSet<String>,
    stop: &mut watch::Receiver<Stop>,
    status: &StatusFile,
    leave: idle::LeaveAt,
) -> Ending {
    let mut next = first;
    loop {
        if leave.retired()
            && let Some(ending) = left(ctx, idle::Leave::Retired, stop, leave).await
        {
            return ending;
        }
        let run_id = next.run_id.clone();
        done.insert(run_id.clone());
        status.phase(Phase::Turn, Some(&run_id), next.ordinal);
        let span = tracing::info_span!("turn", run_id = %run_id, ordinal = next.ordinal, step = "turn", outcome = tracing::field::Empty, error_code = tracing::field::Empty, otel.status_code = tracing::field::Empty);
        if let Some((parent, state)) = &next.trace {
            crate::telemetry::continue_trace(&span, parent, state.as_deref());
        }
        let started = std::time::Instant::now();
        let ended = turn::run(ctx, next, stop).instrument(span.clone()).await;
        turn_ended(&span, started.elapsed(), &ended);
        // A pre-started agent the turn did not use (it never reached its
        // agent) was started for it: it goes with it.
        turn::discard_prestarted(ctx, "its turn ended without using it").await;
        match ended {
            Err(fatal) => return fatal_turn(ctx, fatal).await,
            Ok(TurnEnd::Stopped(s)) => return Ending::Stopped(s),
            Ok(TurnEnd::Sealed(outcome)) if outcome.status == RunOutcome::Failed => {
                let reason = outcome
                    .error
                    .as_ref()
                    .map(|e| e.message.clone())
                    .unwrap_or_else(|| "the turn failed".to_string());
                return sealed_fatal(run_id, reason);
            }
            Ok(TurnEnd::Sealed(_)) => {}
        }
        status.phase(Phase::Idle, None, None);
        drop(tokio::task::spawn_blocking(trim_heap));
        next = loop {
            // No CLI is started for a turn that will not come.
            if !leave.retired() {
                turn::prestart(ctx).await;
            }
            let waited = idle::after_turn(&ctx.api, done, stop, leave)
                .instrument(tracing::info_span!(
                    "step",
                    step = "idle",
                    otel.name = "idle"
                ))
                .await;
            if !matches!(waited, Ok(IdleEnd::Turn(_))) {
                turn::discard_prestarted(ctx, "the session ended or the runner stops").await;
            }
            match waited {
                Ok(IdleEnd::Turn(t)) => break t,
                Ok(IdleEnd::Ended) => return Ending::Clean,
                Ok(IdleEnd::Stopped(s)) => return Ending::Stopped(s),
                Ok(IdleEnd::Leave(why)) => match left(ctx, why, stop, leave).await {
                    Some(ending) => return ending,
                    // Work that could not be pushed keeps the sandbox.
                    None => continue,
                },
                Err(e @ idle::IdleError::SessionTooLarge(_)) => {
                    return Ending::Unreadable(e.into());
                }
                Err(e) => return sealed_fatal(run_id, e.to_string()),
            }
        };
    }
}

/// The runner leaves between turns (4.2, "Leaving the sandbox"): what is
/// in `repo/` since the last turn's harvest (a pre-started CLI or a plugin
/// may have written) is harvested first (the agent state was saved after
/// that turn), then [`release`]. `None`: that work could not be pushed, and
/// an idle runner keeps its sandbox (the next turn's harvest pushes it); a
/// retiring one leaves all the same, saying so. A stop cuts the harvest.
async fn left(
    ctx: &TurnContext,
    why: idle::Leave,
    stop: &mut watch::Receiver<Stop>,
    leave: idle::LeaveAt,
) -> Option<Ending> {
    tracing::info!(why = why.as_str(), "leaving the sandbox");
    turn::discard_prestarted(ctx, "the runner leaves the sandbox").await;
    if ctx.harvester.has_local_work().await {
        let job = HarvestJob {
            name: format!("leave-{}", why.as_str()),
            outcome: None,
            start: None,
            bound: ctx.api.timings().harvest_bound,
        };
        let result = match unless_stopped(stop, ctx.harvester.harvest(job)).await {
            Ok(result) => result,
            Err(s) => return Some(Ending::Stopped(s)),
        };
        if !result.pushed {
            let error = result.push_error.as_ref().map(|e| e.message.clone());
            if why == idle::Leave::Idle {
                tracing::warn!(
                    error,
                    "the work left since the last turn could not be pushed; the runner keeps its sandbox and waits for a turn"
                );
                return None;
            }
            tracing::error!(
                error,
                "the work left since the last turn could not be pushed; the runner retires all the same"
            );
        }
    }
    Some(release(why, leave))
}

/// A turn that failed before its own harvest: harvested here if it left
/// anything (4 step 7).
async fn fatal_turn(ctx: &TurnContext, fatal: TurnFatal) -> Ending {
    let harvest = if fatal.seal == SealState::NotSent && ctx.harvester.has_local_work().await {
        let job = HarvestJob {
            name: fatal.run_id.clone(),
            outcome: Some(RunOutcome::Failed),
            start: None,
            bound: ctx.api.timings().harvest_bound,
        };
        Some(ctx.harvester.harvest(job).await)
    } else {
        None
    };
    Ending::InDrain(Box::new(FatalInDrain { fatal, harvest }))
}

/// A fatal error once run `run_id` is sealed (its events' delivery not
/// known).
fn sealed_fatal(run_id: String, reason: String) -> Ending {
    Ending::InDrain(Box::new(FatalInDrain {
        fatal: TurnFatal {
            run_id,
            reason,
            seal: SealState::Sealed,
            events_delivered: false,
        },
        harvest: None,
    }))
}

/// What step 3 resolves.
struct Resolved {
    bundle: environment::AppliedBundle,
    session: Session,
    remote: Url,
    /// The read repo token of step 3 and when it was asked for: the broker's
    /// seed.
    read_token: RepoToken,
    read_token_at: std::time::SystemTime,
}

async fn resolve(
    config: &BootConfig,
    api: &Api,
    redactor: &Redactor,
) -> Result<Resolved, BootError> {
    let policy = Policy::BOOT_FETCH;
    let read_token_at = std::time::SystemTime::now();
    let (bundle, session, token) = tokio::join!(
        api.env_bundle(),
        api.session(policy, false),
        api.repo_token(Access::Read, policy),
    );
    let bundle = environment::apply_bundle(bundle?, &config.base_env, redactor)?;
    let mut session = session.map_err(|e| match idle::SessionTooLarge::from_call(&e) {
        Some(t) => BootError::from(t),
        None => e.into(),
    })?;
    validate::git_branch("repoBranch", &session.repo_branch)?;
    if let Some(w) = &config.workspace_id {
        session.workspace_id = w.clone();
    }
    let read_token = token?;
    let remote = remote_url(config, &read_token)?;
    Ok(Resolved {
        bundle,
        session,
        remote,
        read_token,
        read_token_at,
    })
}

/// The clone URL (2.5): the artifacts remote, or `{git base}/{owner/name}.git`.
fn remote_url(config: &BootConfig, token: &RepoToken) -> Result<Url, BootError> {
    let text = match (&token.artifacts_remote, &token.repo_full_name) {
        (Some(remote), _) => remote.clone(),
        (None, Some(name)) => format!(
            "{}/{name}.git",
            config.git_base_url.as_str().trim_end_matches('/')
        ),
        (None, None) => return Err(BootError::NoRepository),
    };
    Ok(validate::url("clone URL", &text, config.insecure_http)?)
}

fn write_session_files(
    config: &BootConfig,
    dir: &SessionDir,
    remote: &Url,
) -> Result<(), SessionDirError> {
    let mode = config.credential_mode;
    // Broker mode writes no secret file: the boot secret stays in memory.
    if mode == CredentialMode::File {
        dir.write_boot_secret(&config.api.boot_secret)?;
        dir.create_credential_cache()?;
    }
    let context = BootContext {
        api_base_url: config.api.api_base.to_string(),
        agent_token_url: config.api.agent_token_url.to_string(),
        session_id: config.api.session_id.clone(),
        remote_url: remote.to_string(),
        submodule_remotes: Vec::new(),
        credential_mode: mode,
        credential_socket: (mode == CredentialMode::Broker).then(|| dir.credential_socket_path()),
        boot_secret_path: (mode == CredentialMode::File).then(|| dir.boot_secret_path()),
        credential_cache_path: dir.credential_cache_path(),
        issued_tokens_path: dir.issued_tokens_path(),
        credential_lock_path: dir.credential_lock_path(),
        ca_file: config.ca_file.clone(),
        insecure_http: config.insecure_http,
        time_scale: config.time_scale,
    };
    dir.write_context(&context)
}

/// What the clone and every harvest need: `repo/`, the remote, the branch,
/// the credential helper of this binary, the HTTP client.
fn harvester(
    config: &BootConfig,
    http: reqwest::Client,
    session_dir: &SessionDir,
    remote: &Url,
    branch: &str,
    redactor: &Redactor,
    broker: Option<workspace::Broker>,
) -> Result<Harvester, WorkspaceError> {
    let credential_helper =
        workspace::clone::current_exe_helper_command(&session_dir.context_path())?;
    Ok(Harvester {
        repo_dir: config.root.join("repo"),
        remote_url: remote.to_string(),
        branch: branch.to_string(),
        credential_helper,
        http: workspace::HttpContext {
            client: http,
            runtime: tokio::runtime::Handle::current(),
            request_timeout: config.timings.request_timeout,
            redactor: redactor.clone(),
            stall: config.timings.git_stall,
            broker,
        },
        time_scale: config.timings.scale,
        max_file_size: config.harvest_max_file_size,
        owner: config.agent_user.clone(),
    })
}

/// Clones the session branch or reuses `repo/`, and completes a fresh
/// clone (submodules, LFS: PROTOCOL.md 3, "A complete workspace"); returns
/// whether it was reused, and what the completion did.
async fn clone_repo(
    config: &BootConfig,
    harvester: &Harvester,
    session_dir: &SessionDir,
) -> Result<(bool, workspace::completion::Completion), WorkspaceError> {
    let spec = workspace::RepoSpec {
        root: config.root.clone(),
        remote_url: harvester.remote_url.clone(),
        branch: harvester.branch.clone(),
        credential_helper: harvester.credential_helper.clone(),
        http: harvester.http.clone(),
        retry: Policy::CLONE.scaled(config.timings.scale),
        owner: config.agent_user.clone(),
        git_mirror: config.git_mirror_dir.clone(),
    };
    let branch = harvester.branch.as_str();
    let prepared = workspace::prepare_repo_async(spec).await?;
    let completion = if prepared.reused && !workspace::completion::is_pending(&prepared.path) {
        // A reused repo/ is the agent's: its submodules are as it left them
        // (unless a killed boot left its completion unfinished: then the
        // agent never had it).
        workspace::completion::Completion::default()
    } else {
        let remote = Url::parse(&harvester.remote_url).map_err(|e| WorkspaceError::Git {
            action: "complete",
            url: harvester.remote_url.clone(),
            message: e.to_string(),
        })?;
        let broker = harvester.http.broker.clone();
        let mode = config.credential_mode;
        let allow = |url: &Url| allow_submodule_remote(broker.as_ref(), mode, session_dir, url);
        workspace::completion::complete(
            prepared.path.clone(),
            remote,
            harvester.credential_helper.clone(),
            harvester.http.redactor.clone(),
            config.agent_user.clone(),
            allow,
        )
        .await
    };
    // Nothing else works in repo/ yet: the agent's git finds it its own.
    let owner = harvester.clone();
    let _ = tokio::task::spawn_blocking(move || owner.give_repo_to_owner()).await;
    tracing::info!(head = %prepared.remote_head, reused = prepared.reused, branch, "repository ready");
    Ok((prepared.reused, completion))
}

/// Lets the credential helpers answer for a submodule's remote on the
/// session's host: the broker in memory and, in file mode, the file helper
/// through the boot context (rewritten from the runner's own copy).
fn allow_submodule_remote(
    broker: Option<&workspace::Broker>,
    mode: CredentialMode,
    session_dir: &SessionDir,
    url: &Url,
) {
    if let Some(broker) = broker {
        broker.allow_submodule_remote(url);
    }
    if mode == CredentialMode::File
        && let Err(e) = session_dir.allow_submodule_remote(url.as_str())
    {
        tracing::warn!(remote = %url, error = %e, "cannot let the credential helper answer for a submodule's remote");
    }
}

/// A redactor source (PROTOCOL.md section 3) for the repo tokens the
/// credential helper hands out from its own process: every one is appended
/// to `repo-tokens-issued` before the helper prints it. Polled before every
/// redaction (a `stat`; the file is read only when it grew), so a token is
/// in the set before git or the agent could print it, with no polling
/// window, however many helpers run at once.
fn issued_tokens_source(path: PathBuf) -> crate::redact::SecretSource {
    let mut reader = workspace::IssuedTokens::new(path);
    Box::new(move || reader.poll())
}

/// [`report`], within what the stop budget leaves once a stop signal came
/// (PROTOCOL.md 4.4): an on-stop hook may have spent it, and a report's own
/// bounds (`turn_failed`'s retries) could take the runner far past it.
/// Cut, the ending's exit code stands and the reason says the report was
/// not made.
async fn bounded_report(b: &mut Boot<'_>, ending: Ending) -> (i32, String) {
    let unreported = unreported(&ending);
    let Some(end) = signals::budget_deadline(b.api.timings().stop_budget) else {
        return report(&b.api, &b.config.root, ending, &mut b.stop).await;
    };
    let reporting = report(&b.api, &b.config.root, ending, &mut b.stop);
    match tokio::time::timeout_at(end, reporting).await {
        Ok(reported) => reported,
        Err(_) => {
            tracing::warn!("the stop budget ran out before the ending was reported");
            unreported
        }
    }
}

/// The exit code and reason of `ending` when its report was cut by the
/// stop budget.
fn unreported(ending: &Ending) -> (i32, String) {
    let cut = "its report was cut by the stop budget (PROTOCOL.md 4.4)";
    match ending {
        Ending::Clean => (0, format!("the session ended; {cut}")),
        Ending::Stopped(stop) => (
            stop.exit_code().unwrap_or(1),
            format!("stopped by {}", stop.signal_name()),
        ),
        Ending::BeforeDrain(_) | Ending::Unreadable(_) => (1, format!("failed; {cut}")),
        Ending::InDrain(fatal) => (1, format!("turn {} failed; {cut}", fatal.fatal.run_id)),
        Ending::Left(why, _) => (1, format!("left the sandbox ({}); {cut}", why.as_str())),
    }
}

/// Step 7's report; returns the exit code and the reason the status file
/// records for it. A stop cuts the post of `released` (4.2, "Leaving the
/// sandbox").
async fn report(
    api: &Api,
    root: &Path,
    ending: Ending,
    stop: &mut watch::Receiver<Stop>,
) -> (i32, String) {
    match ending {
        Ending::Clean => {
            tracing::info!("session ended; posting complete");
            match api.post_status(BootStatus::Complete, None, None).await {
                Ok(()) => (0, "the session ended; complete was posted".to_string()),
                Err(e) => {
                    tracing::warn!(error = %e, "complete was not delivered (best-effort)");
                    (
                        0,
                        format!("the session ended; complete was not delivered ({e})"),
                    )
                }
            }
        }
        Ending::Stopped(stop) => stopped(stop),
        Ending::BeforeDrain(e) | Ending::Unreadable(e) => {
            let reason = e.reason();
            tracing::error!(reason = %reason, "boot failed");
            match api
                .post_status(BootStatus::Failed, None, Some(&reason))
                .await
            {
                Ok(()) => (1, format!("failed (reported): {reason}")),
                Err(e) => {
                    tracing::warn!(error = %e, "failed status was not delivered (best-effort); exit 1 all the same");
                    (1, format!("failed (NOT reported: {e}): {reason}"))
                }
            }
        }
        Ending::Left(why, true) => {
            tracing::info!(why = why.as_str(), "posting released");
            let post = api.post_status(BootStatus::Released, None, Some(why.as_str()));
            match unless_stopped(stop, post).await {
                Err(s) => stopped(s),
                Ok(Ok(())) => (0, format!("released the session ({})", why.as_str())),
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "released was not acknowledged");
                    (
                        1,
                        format!(
                            "left the sandbox ({}), and released was NOT acknowledged: {e}",
                            why.as_str()
                        ),
                    )
                }
            }
        }
        Ending::Left(why, false) => (
            EXIT_LEFT_UNRELEASED,
            format!(
                "left the sandbox ({}); nothing posted: the coordinator does not accept released, and the session needs a new sandbox for its next turn",
                why.as_str()
            ),
        ),
        Ending::InDrain(fatal) => {
            let run_id = fatal.fatal.run_id.clone();
            let why = fatal.fatal.reason.clone();
            let reported = report_fatal_turn(api, root, *fatal).await;
            let how = if reported { "reported" } else { "NOT reported" };
            (1, format!("turn {run_id} failed ({how}): {why}"))
        }
    }
}

/// The report of a stop: nothing posted, exit 128+N.
fn stopped(stop: Stop) -> (i32, String) {
    tracing::warn!(signal = %stop.signal_name(), "stopped by signal");
    (
        stop.exit_code().unwrap_or(1),
        format!("stopped by {}", stop.signal_name()),
    )
}

/// Step 7 once the drain began: seals the run `failed` (`runner_error`)
/// unless it is sealed, then posts `turn_failed` for it; returns whether
/// `turn_failed` was acknowledged.
async fn report_fatal_turn(api: &Api, root: &Path, fatal: FatalInDrain) -> bool {
    let FatalInDrain {
        fatal:
            TurnFatal {
                run_id,
                reason,
                seal,
                events_delivered,
            },
        harvest,
    } = fatal;
    tracing::error!(run_id = %run_id, reason = %reason, "turn failed");
    let body = match seal {
        SealState::Sealed => None,
        SealState::Unknown(body) => Some(body),
        // A verdict is never repeated: the run is sealed as the fatal path
        // seals one, with the harvest the refused body reported.
        SealState::Refused(refused) => Some(FinishBody {
            status: RunOutcome::Failed,
            agent_session_id: refused.agent_session_id,
            error: Some(FinishError {
                code: ErrorCode::RunnerError,
                message: reason.clone(),
                retryable: false,
                retry_after_ms: None,
                resets_at: None,
            }),
            usage: refused.usage,
            result: refused.result,
            agent_session_reset: refused.agent_session_reset,
            resources: refused.resources,
        }),
        SealState::NotSent => Some(FinishBody {
            status: RunOutcome::Failed,
            agent_session_id: None,
            error: Some(FinishError {
                code: ErrorCode::RunnerError,
                message: reason.clone(),
                retryable: false,
                retry_after_ms: None,
                resets_at: None,
            }),
            usage: None,
            result: harvest,
            agent_session_reset: None,
            resources: None,
        }),
    };
    let sealed = match body {
        None => true,
        Some(body) => match api.finish(&run_id, &body, Policy::REQUIRED).await {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(run_id = %run_id, error = %e, "the run could not be sealed");
                false
            }
        },
    };
    if sealed {
        remove_run_dir_if_delivered(root, &run_id, events_delivered);
    }
    match api
        .post_status(BootStatus::TurnFailed, Some(&run_id), Some(&reason))
        .await
    {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(run_id = %run_id, error = %e, "turn_failed was not acknowledged; exit 1 all the same");
            false
        }
    }
}

/// The fatal path's end of a sealed run's directory (PROTOCOL.md 3): it goes
/// (prompt and spool) once its events are delivered, which is known when the
/// turn's flush said so (`delivered`) or when its spool holds no event.
/// Otherwise the spool is what `finish` said the undelivered events remain
/// in: it stays for a later boot on this root to deliver (2.6).
fn remove_run_dir_if_delivered(root: &Path, run_id: &str, delivered: bool) {
    let path = root.join(session_dir::RUN_PARENT).join(run_id);
    if !path.exists() {
        return;
    }
    let spooled =
        std::fs::metadata(path.join(crate::events::spool::SPOOL_FILE)).is_ok_and(|m| m.len() > 0);
    if spooled && !delivered {
        tracing::warn!(
            run_id,
            "the run's event spool is kept: a later boot on this root delivers what the coordinator lacks"
        );
        return;
    }
    match session_dir::RunDir::create(root, run_id) {
        Ok(dir) => {
            if let Err(e) = dir.remove() {
                tracing::warn!(run_id, error = %e, "cannot remove the run directory");
            }
        }
        Err(e) => tracing::warn!(run_id, error = %e, "cannot remove the run directory"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tester's break: an `--instructions-file` that is a FIFO hung the
    /// boot forever in a blocking read. A FIFO, a directory and a file over
    /// the bound are refused at once; a regular file is read.
    #[test]
    fn an_instructions_file_that_is_not_a_regular_file_or_too_large_is_refused_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("fifo");
        rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, rustix::fs::Mode::RUSR).unwrap();
        assert!(read_instructions_file(&fifo).is_err());
        assert!(read_instructions_file(tmp.path()).is_err());
        let big = tmp.path().join("big");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_INSTRUCTIONS_FILE + 1)
            .unwrap();
        assert!(read_instructions_file(&big).is_err());
        let ok = tmp.path().join("ok.md");
        std::fs::write(&ok, "Be brief.").unwrap();
        assert_eq!(read_instructions_file(&ok).unwrap(), "Be brief.");
    }
}
