//! The boot of PROTOCOL.md section 4, in order. This is the only module that
//! knows the order of the steps; each step is a function that takes what it
//! needs and returns what the next one needs. It owns the session
//! directory's life and the reporting on every exit path (step 7).

pub mod config;
pub mod environment;
pub mod idle;

use std::collections::HashSet;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use reqwest::Url;
use tokio::sync::watch;
use tracing::Instrument;

use crate::client::{Api, CallError, Policy, RepoToken};
use crate::process::supervisor::Supervision;
use crate::redact::Redactor;
use crate::session_dir::{self, BootContext, SessionDir};
use crate::signals::{self, Stop};
use crate::status::{Phase, StatusFile};
use crate::turn::{self, SealState, TurnContext, TurnEnd, TurnInput};
use crate::validate;
use crate::wire::{
    Access, BootStatus, ErrorCode, FinishBody, FinishError, HarvestResult, RunOutcome, Session,
};
use crate::workspace::{self, HarvestJob, Harvester};
use config::BootConfig;
use idle::IdleEnd;

/// How the boot ended, before reporting (step 7).
// One value per boot: boxing the large variant buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Ending {
    /// The session ended: `complete`, exit 0.
    Clean,
    /// A stop signal (4.4): nothing posted, exit 128+N.
    Stopped(Stop),
    /// Fatal before the drain began: `failed`, exit 1.
    BeforeDrain(String),
    /// Between turns, a session whose next turn cannot be read
    /// (`session_too_large`): `failed`, exit 1. The last run is sealed and
    /// acknowledged already, and the next one was never read, so there is
    /// no run to seal or to name in `turn_failed` (PROTOCOL.md 4 step 7).
    Unreadable(String),
    /// Fatal once the drain began: seal if needed, `turn_failed`, exit 1.
    InDrain {
        run_id: String,
        reason: String,
        seal: SealState,
        /// The harvest of the fatal path (4 step 7), for an unsealed run.
        harvest: Option<HarvestResult>,
        /// Whether the run's events are known to be delivered (see
        /// [`remove_run_dir_if_delivered`]).
        events_delivered: bool,
    },
}

/// Runs the boot and returns the process exit code: 0 clean end, 1 failure
/// after reporting it, 128+N stopped by signal N.
pub async fn run(config: BootConfig) -> i32 {
    let redactor = Redactor::new();
    let _log = crate::logging::init(config.log_format, redactor.clone());
    if config.time_scale != 1.0 {
        tracing::warn!(
            scale = config.time_scale,
            "HOSTED_BOOT_TEST_TIME_SCALE is set: every contract duration is scaled (for tests only)"
        );
    }
    if config.insecure_http {
        tracing::warn!("HOSTED_BOOT_INSECURE_HTTP=1: plain http is accepted for any host");
    }
    let http = match crate::tls::http_client(config.ca_file.as_deref()) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("hosted-boot: configuration error: {e:#}");
            return 2;
        }
    };
    let mut stop = match signals::listen() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("hosted-boot: {e}");
            return 1;
        }
    };
    crate::status_line::enable(
        config
            .log_format
            .unwrap_or(if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                crate::logging::LogFormat::Text
            } else {
                crate::logging::LogFormat::Json
            })
            == crate::logging::LogFormat::Text,
    );
    let status = StatusFile::create(&config.root, &config.api.session_id);
    let heartbeat = {
        let status = status.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(crate::status::HEARTBEAT).await;
                status.touch();
            }
        })
    };
    let contact = status.clone();
    let api = Arc::new(
        Api::new(
            config.api.clone(),
            http.clone(),
            config.timings,
            redactor.clone(),
        )
        .with_contact_hook(Arc::new(move |ok| contact.contact(ok))),
    );
    tracing::info!(
        session_id = %config.api.session_id,
        agent = config.agent.name(),
        version = env!("CARGO_PKG_VERSION"),
        "boot starting"
    );

    let mut session_dir: Option<Arc<SessionDir>> = None;
    let ending = boot(
        &config,
        &api,
        http,
        &redactor,
        &mut stop,
        &mut session_dir,
        &status,
    )
    .instrument(tracing::info_span!("boot", session_id = %config.api.session_id))
    .await;
    status.phase(Phase::Stopping, None, None);
    heartbeat.abort();
    let code = report(&api, &config.root, ending).await;
    if let Some(dir) = session_dir {
        if let Err(e) = dir.remove_bearer() {
            tracing::error!(error = %e, "cannot remove the bearer file");
        }
        if let Err(e) = dir.remove() {
            tracing::error!(error = %e, "cannot remove the session directory");
        }
    }
    tracing::info!(exit_code = code, "boot finished");
    code
}

/// Runs `f` unless a stop signal comes first.
async fn unless_stopped<T>(
    stop: &mut watch::Receiver<Stop>,
    f: impl Future<Output = T>,
) -> Result<T, Stop> {
    if *stop.borrow() != Stop::Running {
        return Err(*stop.borrow());
    }
    tokio::pin!(f);
    loop {
        tokio::select! {
            r = &mut f => return Ok(r),
            changed = stop.changed() => {
                if changed.is_ok() && *stop.borrow() != Stop::Running {
                    return Err(*stop.borrow());
                }
                if changed.is_err() {
                    return Ok(f.await);
                }
            }
        }
    }
}

/// What step 3 resolves.
struct Resolved {
    bundle: environment::AppliedBundle,
    session: Session,
    remote: Url,
}

async fn boot(
    config: &BootConfig,
    api: &Arc<Api>,
    http: reqwest::Client,
    redactor: &Redactor,
    stop: &mut watch::Receiver<Stop>,
    session_dir_slot: &mut Option<Arc<SessionDir>>,
    status: &StatusFile,
) -> Ending {
    let timings = *api.timings();
    // A session directory left by a SIGKILLed boot goes before anything else
    // (creating ours removes it), so no stale bearer or secret outlives it.
    let session_dir = match SessionDir::create(&config.root, &config.api.session_id) {
        Ok(d) => Arc::new(d),
        Err(e) => return Ending::BeforeDrain(e.to_string()),
    };
    *session_dir_slot = Some(session_dir.clone());

    // Step 2: the agent bearer.
    match unless_stopped(stop, api.pull_bearer(Policy::AGENT_TOKEN_BOOT)).await {
        Err(s) => return Ending::Stopped(s),
        Ok(Err(e)) => return Ending::BeforeDrain(e.to_string()),
        Ok(Ok(_)) => {}
    }

    // Step 3: env bundle, session, read repo token, concurrently.
    let resolved = match unless_stopped(stop, resolve(config, api, redactor)).await {
        Err(s) => return Ending::Stopped(s),
        Ok(Err(reason)) => return Ending::BeforeDrain(reason),
        Ok(Ok(r)) => r,
    };
    let mut done = HashSet::new();
    let active = resolved.session.is_active();
    let selected = if active {
        match idle::select_turn(&resolved.session, true, &done) {
            Err(e) => return Ending::BeforeDrain(e.to_string()),
            Ok(t) => t,
        }
    } else {
        None
    };

    // Events earlier boots could not deliver (PROTOCOL.md 2.6, 4 step 3),
    // before this boot runs or waits for anything, so that a boot with
    // nothing to run delivers them too. The turn about to run resumes its
    // own spool.
    let current = selected.as_ref().map_or("", |t| t.run_id.as_str());
    let leftovers = crate::events::deliver_leftovers(api, &config.root, current);
    if let Err(s) = unless_stopped(stop, leftovers).await {
        return Ending::Stopped(s);
    }

    // Step 4: nothing to run → ready, then wait.
    if !active {
        tracing::info!(status = ?resolved.session.status, "the session is no longer active");
        return Ending::Clean;
    }
    let first = match selected {
        Some(turn) => turn,
        None => {
            tracing::info!("nothing to run yet; posting ready and waiting for a turn");
            match unless_stopped(stop, api.post_status(BootStatus::Ready, None, None)).await {
                Err(s) => return Ending::Stopped(s),
                Ok(Err(e)) => {
                    return Ending::BeforeDrain(format!("ready was not acknowledged: {e}"));
                }
                Ok(Ok(())) => {}
            }
            status.phase(Phase::Idle, None, None);
            match idle::wait(api, true, &done, stop)
                .instrument(tracing::info_span!("step", step = "idle"))
                .await
            {
                Ok(IdleEnd::Turn(t)) => t,
                Ok(IdleEnd::Ended) => return Ending::Clean,
                Ok(IdleEnd::Stopped(s)) => return Ending::Stopped(s),
                Err(e) => return Ending::BeforeDrain(e.to_string()),
            }
        }
    };

    // Step 5: session files, credential helper, clone.
    status.phase(Phase::Cloning, None, None);
    if let Err(e) = write_session_files(config, &session_dir, &resolved.remote) {
        return Ending::BeforeDrain(e);
    }
    redactor.add_source(issued_tokens_source(session_dir.issued_tokens_path()));
    let repo_dir = config.root.join("repo");
    let harvester = match harvester(
        config,
        http,
        &session_dir,
        &resolved.remote,
        &resolved.session.repo_branch,
        redactor,
    ) {
        Ok(h) => h,
        Err(reason) => {
            return Ending::BeforeDrain(reason);
        }
    };
    let clone =
        clone_repo(config, &harvester).instrument(tracing::info_span!("step", step = "clone"));
    let reused = match unless_stopped(stop, clone).await {
        Err(s) => {
            return Ending::Stopped(s);
        }
        Ok(Err(reason)) => {
            return Ending::BeforeDrain(reason);
        }
        Ok(Ok(reused)) => reused,
    };
    // A reused repo/ (section 3): its work is harvested first, which also
    // brings the local session branch to the remote's (4.5).
    let mut recovered_at_boot = None;
    if reused {
        let job = HarvestJob {
            name: workspace::RECOVERED_AT_BOOT.to_string(),
            outcome: None,
            start: None,
            bound: timings.harvest_bound,
        };
        match unless_stopped(stop, harvester.harvest(job)).await {
            Err(s) => {
                return Ending::Stopped(s);
            }
            Ok(result) => recovered_at_boot = Some(result),
        }
    }

    // Step 6: drain turns.
    let ctx = TurnContext {
        api: api.clone(),
        session_dir: session_dir.clone(),
        root: config.root.clone(),
        repo_dir,
        agent: config.agent.clone(),
        agent_env: environment::agent_env(
            &config.base_env,
            &resolved.bundle,
            &config.api,
            &resolved.session.client_info,
        ),
        supervision: Supervision {
            drain: timings.pipe_drain,
            time_cap: Supervision::time_cap_from_minutes(
                resolved.session.client_info.duration_minutes,
            ),
            cap_grace: timings.interrupt_grace,
            cgroup: config.turn_cgroup,
            guard_exe: Some(PathBuf::from("/proc/self/exe")),
        },
        agent_session: Arc::new(crate::agent::AgentSession::new(
            &resolved.session.client_info,
            resolved.session.agent_session_id.clone(),
        )),
        harvester,
        recovered_at_boot: std::sync::Mutex::new(recovered_at_boot),
    };
    drain(&ctx, first, &mut done, stop, status).await
}

async fn drain(
    ctx: &TurnContext,
    first: TurnInput,
    done: &mut HashSet<String>,
    stop: &mut watch::Receiver<Stop>,
    status: &StatusFile,
) -> Ending {
    let mut next = first;
    loop {
        let run_id = next.run_id.clone();
        done.insert(run_id.clone());
        status.phase(Phase::Turn, Some(&run_id), next.ordinal);
        let span =
            tracing::info_span!("turn", run_id = %run_id, ordinal = next.ordinal, step = "turn");
        match turn::run(ctx, next, stop).instrument(span).await {
            Err(f) => {
                // A turn that failed before its own harvest: harvest here if
                // it left anything (4 step 7).
                let harvest =
                    if f.seal == SealState::NotSent && ctx.harvester.has_local_work().await {
                        let job = HarvestJob {
                            name: f.run_id.clone(),
                            outcome: Some(RunOutcome::Failed),
                            start: None,
                            bound: ctx.api.timings().harvest_bound,
                        };
                        Some(ctx.harvester.harvest(job).await)
                    } else {
                        None
                    };
                return Ending::InDrain {
                    run_id: f.run_id,
                    reason: f.reason,
                    seal: f.seal,
                    harvest,
                    events_delivered: f.events_delivered,
                };
            }
            Ok(TurnEnd::Stopped(s)) => return Ending::Stopped(s),
            Ok(TurnEnd::Sealed(outcome)) => {
                if outcome.status == RunOutcome::Failed {
                    let reason = outcome
                        .error
                        .as_ref()
                        .map(|e| e.message.clone())
                        .unwrap_or_else(|| "the turn failed".to_string());
                    return Ending::InDrain {
                        run_id,
                        reason,
                        seal: SealState::Sealed,
                        harvest: None,
                        events_delivered: false,
                    };
                }
            }
        }
        status.phase(Phase::Idle, None, None);
        next = match idle::wait(&ctx.api, false, done, stop)
            .instrument(tracing::info_span!("step", step = "idle"))
            .await
        {
            Ok(IdleEnd::Turn(t)) => t,
            Ok(IdleEnd::Ended) => return Ending::Clean,
            Ok(IdleEnd::Stopped(s)) => return Ending::Stopped(s),
            Err(e @ idle::IdleError::SessionTooLarge(_)) => {
                return Ending::Unreadable(e.to_string());
            }
            Err(e) => {
                return Ending::InDrain {
                    run_id,
                    reason: e.to_string(),
                    seal: SealState::Sealed,
                    harvest: None,
                    events_delivered: false,
                };
            }
        };
    }
}

async fn resolve(config: &BootConfig, api: &Api, redactor: &Redactor) -> Result<Resolved, String> {
    let policy = Policy::BOOT_FETCH;
    let (bundle, session, token) = tokio::join!(
        api.env_bundle(),
        api.session(policy, false),
        api.repo_token(Access::Read, policy),
    );
    let bundle = environment::apply_bundle(
        bundle.map_err(|e| e.to_string())?,
        &config.base_env,
        redactor,
    )
    .map_err(|e| e.to_string())?;
    let mut session = session.map_err(|e| idle::session_read_reason(&e))?;
    validate::git_branch("repoBranch", &session.repo_branch).map_err(|e| e.to_string())?;
    if let Some(w) = &config.workspace_id {
        session.workspace_id = w.clone();
    }
    let token: RepoToken = token.map_err(|e: CallError| e.to_string())?;
    let remote = remote_url(config, &token)?;
    Ok(Resolved {
        bundle,
        session,
        remote,
    })
}

/// The clone URL (2.5): the artifacts remote, or `{git base}/{owner/name}.git`.
fn remote_url(config: &BootConfig, token: &RepoToken) -> Result<Url, String> {
    let text = match (&token.artifacts_remote, &token.repo_full_name) {
        (Some(remote), _) => remote.clone(),
        (None, Some(name)) => format!(
            "{}/{name}.git",
            config.git_base_url.as_str().trim_end_matches('/')
        ),
        (None, None) => return Err("the repo token names no repository".to_string()),
    };
    validate::url("clone URL", &text, config.insecure_http).map_err(|e| e.to_string())
}

fn write_session_files(config: &BootConfig, dir: &SessionDir, remote: &Url) -> Result<(), String> {
    dir.write_boot_secret(&config.api.boot_secret)
        .map_err(|e| e.to_string())?;
    dir.create_credential_cache().map_err(|e| e.to_string())?;
    let context = BootContext {
        api_base_url: config.api.api_base.to_string(),
        agent_token_url: config.api.agent_token_url.to_string(),
        session_id: config.api.session_id.clone(),
        remote_url: remote.to_string(),
        boot_secret_path: dir.boot_secret_path(),
        credential_cache_path: dir.credential_cache_path(),
        issued_tokens_path: dir.issued_tokens_path(),
        credential_lock_path: dir.credential_lock_path(),
        ca_file: config.ca_file.clone(),
        insecure_http: config.insecure_http,
        time_scale: config.time_scale,
    };
    dir.write_context(&context).map_err(|e| e.to_string())
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
) -> Result<Harvester, String> {
    let credential_helper =
        workspace::clone::current_exe_helper_command(&session_dir.context_path())
            .map_err(|e| e.to_string())?;
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
        },
        push_policy: Policy::HARVEST_PUSH.scaled(config.timings.scale),
        max_file_size: config.harvest_max_file_size,
    })
}

/// Clones the session branch or reuses `repo/`; returns whether it was
/// reused.
async fn clone_repo(config: &BootConfig, harvester: &Harvester) -> Result<bool, String> {
    let spec = workspace::RepoSpec {
        root: config.root.clone(),
        remote_url: harvester.remote_url.clone(),
        branch: harvester.branch.clone(),
        credential_helper: harvester.credential_helper.clone(),
        http: harvester.http.clone(),
        retry: Policy::CLONE.scaled(config.timings.scale),
    };
    let branch = harvester.branch.as_str();
    workspace::prepare_repo_async(spec)
        .await
        .map(|prepared| {
            tracing::info!(head = %prepared.remote_head, reused = prepared.reused, branch, "repository ready");
            prepared.reused
        })
        .map_err(|e| e.to_string())
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

/// Step 7: reports the ending and returns the exit code.
async fn report(api: &Api, root: &std::path::Path, ending: Ending) -> i32 {
    match ending {
        Ending::Clean => {
            tracing::info!("session ended; posting complete");
            if let Err(e) = api.post_status(BootStatus::Complete, None, None).await {
                tracing::warn!(error = %e, "complete was not delivered (best-effort)");
            }
            0
        }
        Ending::Stopped(stop) => {
            tracing::warn!(signal = ?stop.signal(), "stopped by signal");
            stop.exit_code().unwrap_or(1)
        }
        Ending::BeforeDrain(reason) | Ending::Unreadable(reason) => {
            tracing::error!(reason = %reason, "boot failed");
            if let Err(e) = api
                .post_status(BootStatus::Failed, None, Some(&reason))
                .await
            {
                tracing::warn!(error = %e, "failed status was not delivered (best-effort)");
            }
            1
        }
        Ending::InDrain {
            run_id,
            reason,
            seal,
            harvest,
            events_delivered,
        } => {
            tracing::error!(run_id = %run_id, reason = %reason, "turn failed");
            let body = match seal {
                SealState::Sealed => None,
                SealState::Unknown(body) => Some(body),
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
            if let Err(e) = api
                .post_status(BootStatus::TurnFailed, Some(&run_id), Some(&reason))
                .await
            {
                tracing::error!(run_id = %run_id, error = %e, "turn_failed was not acknowledged");
            }
            1
        }
    }
}

/// The fatal path's end of a sealed run's directory (PROTOCOL.md 3): it goes
/// (prompt and spool) once its events are delivered, which is known when the
/// turn's flush said so (`delivered`) or when its spool holds no event.
/// Otherwise the spool is what `finish` said the undelivered events remain
/// in: it stays for a later boot on this root to deliver (2.6).
fn remove_run_dir_if_delivered(root: &std::path::Path, run_id: &str, delivered: bool) {
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
