//! The reference coordinator (PROTOCOL.md section 6): one session per
//! process by default, or a fleet of them (`fleet`), in memory, serving every route of section 2, a bare git
//! repository over smart HTTP, and a dev API to queue turns, interrupt, end
//! the session and inject faults.
//!
//! Used three ways: `hosted-boot-coordinator serve` ([`run_cli`]), in-process
//! by the integration tests and by `hosted-boot-coordinator demo`
//! ([`Coordinator::start`]); the binary is `src/main.rs`.
//! A crate of its own (hosted-boot-coordinator, issue 34), on the contract
//! (hosted-boot-wire) alone: nothing of the runner.
//!
//! Layout: `state` holds the session and the records, `server` the
//! HTTP handler (routing by the route table of [`crate::wire::routes`],
//! auth, faults, request record), `dev` the dev API, `git` the bare
//! repository and `git http-backend`, `conn` the listener whose connections a
//! `reset` fault can drop, `cli` the command.
//!
//! Choices the runner can rely on:
//! - Run ids are `run-<ordinal>`; the initial task is `run-1` (unless the
//!   session starts idle) and is never shown in `pendingTurn`; `pendingTurn`
//!   is the lowest-ordinal unfinished run, shown only when that run is a
//!   queued turn (so a turn queued while `run-1` is unfinished waits for it).
//! - Bearers and repo tokens carry `expiresAt` as RFC 3339; every one issued
//!   stays valid until its own TTL.
//! - Read repo tokens cannot push (`403`); pushes may update only the session
//!   branch and `<branch>-recovered-*`, never delete a branch or rewrite it
//!   (non-fast-forward refused); with a file size limit set
//!   ([`CoordinatorOptions::git_max_file_size`], `POST dev/git`), a push
//!   that brings a larger file is refused whole.
//! - Errors are `{"error": "…"}` with `400` (malformed body), `401` (auth),
//!   `404` (unknown session, run or path; for a path, the error names the
//!   method and the path), `405`, `409` (event gap, finish
//!   with another status, `run_started` on a sealed run), `413`.

// The lints' test exemptions, as in the runner's lib.rs.
#![cfg_attr(
    test,
    allow(
        clippy::string_slice,
        clippy::cast_possible_wrap,
        clippy::unchecked_time_subtraction,
        reason = "test code: a panic is a test failure"
    )
)]

mod cli;
mod conn;
pub mod demo;
mod dev;
mod fleet;
mod git;
mod latency;
mod long_poll;
mod request_log;
mod served;
mod server;
mod state;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use url::Url;

pub use crate::wire::routes::Route;
pub use cli::{CoordinatorArgs, run_cli};
pub use git::{SAMPLE_LFS_CONTENT, create_complete_sample_repos, create_sample_repo};
pub use state::{DevError, Fault, RecordedRequest, RunRecord, Snapshot, Target};

// The contract's modules under the names the runner gives them, so that
// `crate::wire::…` reads alike in both crates.
pub(crate) use hosted_boot_wire::locks::lock;
pub(crate) use hosted_boot_wire::{secret, text, timings, validate, wire};
// Public: the binary (main.rs) finds the runner with it.
pub use hosted_boot_wire::runner_binary;

use crate::secret::Secret;
use crate::wire::{AnswerToQuestion, BootStatusBody, ClientInfo};

/// How a [`Coordinator`] is set up. `CoordinatorOptions::default()` is a
/// session `s1` on `127.0.0.1` (a free port) for `acme/app` with the sample
/// repository, branch `orizu/session-1`, the initial task pending as `run-1`,
/// and one-hour bearers and repo tokens.
#[derive(Clone, Debug)]
pub struct CoordinatorOptions {
    /// The session id (`ORIZU_SESSION_ID`); must be path-safe.
    pub session_id: String,
    /// `workspaceId` of the session.
    pub workspace_id: String,
    /// `repoFullName` of the repo token (`owner/name`).
    pub repo_full_name: String,
    /// The session branch (`repoBranch`).
    pub branch: String,
    /// Create the session branch in the bare repository from its default
    /// branch (turn off to test `session_branch_missing`).
    pub create_branch: bool,
    /// A non-bare repository to clone bare; `None`: a sample repository
    /// ([`create_sample_repo`]).
    pub source_repo: Option<PathBuf>,
    /// Where the bare repository (`git/{owner}/{name}.git`) and the sample
    /// repository live; `None`: a temporary directory removed when the
    /// coordinator is dropped.
    pub workdir: Option<PathBuf>,
    /// `clientInfo.task`, the initial task.
    pub task: String,
    /// `clientInfo.model`.
    pub model: Option<String>,
    /// `clientInfo.reasoningEffort`.
    pub reasoning_effort: Option<String>,
    /// `clientInfo.surface`.
    pub surface: Option<String>,
    /// `clientInfo.durationMinutes` (per-turn time cap).
    pub duration_minutes: Option<f64>,
    /// The session's `agentSessionId` at start (an agent session to resume).
    pub agent_session_id: Option<String>,
    /// Start with no run at all (the boot posts `ready` and waits); the first
    /// queued turn is then `run-1`, shown in `pendingTurn`.
    pub start_idle: bool,
    /// The env bundle's connectors (`NAME`, value), served as given (no check,
    /// so tests can serve reserved names).
    pub connectors: Vec<(String, String)>,
    /// The env bundle's `redactVars`.
    pub redact_vars: Vec<String>,
    /// Connectors (`NAME`, value) served with `"scope": "setup"`: for the
    /// setup script only (PROTOCOL.md 2.3).
    pub setup_connectors: Vec<(String, String)>,
    /// The session's `setup` field (script, inputs) at start; changed later
    /// with [`Coordinator::set_setup`] or `POST dev/setup`.
    pub setup: Option<crate::wire::SessionSetup>,
    /// Lifetime of each agent bearer (2.1).
    pub bearer_ttl: Duration,
    /// Lifetime of each repo token (2.5).
    pub repo_token_ttl: Duration,
    /// Whether repo-token answers carry `expiresAt` (turn off to serve
    /// tokens the credential helper does not cache, PROTOCOL.md 2.5 and 3);
    /// the tokens expire after `repo_token_ttl` either way.
    pub repo_token_expires_at: bool,
    /// Address to listen on; a non-loopback address makes the dev API require
    /// the dev token ([`Coordinator::dev_token`]).
    pub listen: SocketAddr,
    /// The base URL to advertise (in [`Coordinator::base_url`] and the
    /// sandbox's environment) instead of the listening address, e.g. for a
    /// compose network. Must end with `/`.
    pub advertise_url: Option<Url>,
    /// The git server refuses a push that brings a file (blob) larger than
    /// this many bytes, the whole push, as a git host with a file size limit
    /// does (GitHub: 100 MiB); `None`: no limit. Changed later with
    /// [`Coordinator::set_git_max_file_size`] or `POST dev/git`.
    pub git_max_file_size: Option<u64>,
    /// The coordinator's clock against the local one, in seconds, as its
    /// agent-token answers show it (their `Date` header and `expiresAt`):
    /// a sandbox whose clock is wrong by that much (PROTOCOL.md 2.1,
    /// "Clocks"). The bearers still live `bearer_ttl`.
    pub clock_offset_s: i64,
    /// The `expiresAt` of agent-token answers, in seconds from the
    /// coordinator's now (negative: in the past), instead of `bearer_ttl`;
    /// the bearers still live `bearer_ttl`.
    pub bearer_expires_in_s: Option<i64>,
    /// The session's `egressCanary` (2.4 extension); changed later with
    /// [`Coordinator::set_around_agent`] or `POST dev/around-agent`.
    pub egress_canary: Option<String>,
    /// The session's `instructions` (2.4 extension), likewise.
    pub instructions: Option<String>,
    /// Offer the long-poll of the session read (PROTOCOL.md 2.4): an `ETag`
    /// on every session answer, a read with `Prefer: wait=N` and a matching
    /// `If-None-Match` held until the session changes. Off by default here
    /// (the suite's runners poll as without it); `hosted-boot-coordinator serve`
    /// turns it on unless `--no-long-poll`.
    pub long_poll: bool,
    /// How many sessions to serve (at least 1): the first is `session_id`,
    /// the others `{session_id}-2`, `-3`, … on branches `{branch}-2`, … of
    /// the same repository, each with a boot secret of its own and started
    /// as `start_idle` says (PROTOCOL.md section 6, "Fleet"). More can be
    /// added later ([`Coordinator::add_session`], `POST dev/sessions`).
    pub sessions: usize,
    /// Every route of the contract and every git request is answered no
    /// sooner than this after it arrived (the dev API never waits), as by a
    /// coordinator one round trip of this away; zero (the default): at once.
    /// `--latency-ms`; what `bench/boot-latency` measures against.
    pub latency: Duration,
    /// Keep counts of what the runner sends, not its bodies: an accepted
    /// event keeps its `seq`, `type` and `at` but not its `data`, and a
    /// recorded request its length but not its body. The coordinator's
    /// memory then stays flat over a long session, so a benchmark of the
    /// runner's memory (`bench/memory`, 1,000 turns, 10 MB of output a
    /// turn) measures the runner. Off by default (tests read the bodies);
    /// `--counts-only`.
    pub counts_only: bool,
    /// The session's `agentState` offer (2.4, 2.7): the agent-state route
    /// is served and takes a saved state up to this many bytes (at most
    /// 16 MiB, the largest request body read); `None`: not offered, as a
    /// coordinator without the extension. Default 8 MiB.
    pub agent_state_max_bytes: Option<u64>,
    /// The session's `acceptsReleased` (2.2, 2.4): the runner may release
    /// an idle or retired sandbox with the `released` status. Default on.
    pub accepts_released: bool,
}

/// The reference coordinator's default `session.agentState.maxBytes`.
pub const DEFAULT_AGENT_STATE_MAX_BYTES: u64 = 8 * 1024 * 1024;

impl Default for CoordinatorOptions {
    fn default() -> Self {
        CoordinatorOptions {
            session_id: "s1".into(),
            workspace_id: "ws-1".into(),
            repo_full_name: "acme/app".into(),
            branch: "orizu/session-1".into(),
            create_branch: true,
            source_repo: None,
            workdir: None,
            task: "Add a short CONTRIBUTING.md describing how to run the project.".into(),
            model: None,
            reasoning_effort: None,
            surface: None,
            duration_minutes: None,
            agent_session_id: None,
            start_idle: false,
            connectors: Vec::new(),
            redact_vars: Vec::new(),
            setup_connectors: Vec::new(),
            setup: None,
            bearer_ttl: Duration::from_secs(3600),
            repo_token_ttl: Duration::from_secs(3600),
            repo_token_expires_at: true,
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            advertise_url: None,
            git_max_file_size: None,
            clock_offset_s: 0,
            bearer_expires_in_s: None,
            egress_canary: None,
            instructions: None,
            long_poll: false,
            sessions: 1,
            latency: Duration::ZERO,
            counts_only: false,
            agent_state_max_bytes: Some(DEFAULT_AGENT_STATE_MAX_BYTES),
            accepts_released: true,
        }
    }
}

/// The Git LFS pointer file of `content` (the spec's v1 text), to commit
/// in place of the file in a repository whose object the coordinator
/// holds ([`Coordinator::add_lfs_object`]).
pub fn lfs_pointer(content: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, content);
    let oid: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {}\n",
        content.len()
    )
}

/// A running reference coordinator. Dropping it stops the server (and removes
/// its temporary directory, if it made one); [`Coordinator::shutdown`] stops
/// it gracefully.
pub struct Coordinator {
    shared: Arc<server::Shared>,
    fleet: Arc<fleet::Fleet>,
    base_url: Url,
    local_addr: SocketAddr,
    shutdown_tx: Mutex<Option<oneshot::Sender<()>>>,
    task: Mutex<Option<JoinHandle<()>>>,
    _tmp: Option<tempfile::TempDir>,
}

impl Coordinator {
    /// Prepares the bare repository, binds `opts.listen` and starts serving.
    ///
    /// Errors: an invalid session id, repository name or branch; a failing
    /// `git` command (the `git` CLI must be on `PATH`); an existing bare
    /// repository in `workdir`; an address that cannot be bound.
    pub async fn start(opts: CoordinatorOptions) -> anyhow::Result<Coordinator> {
        crate::validate::path_safe_id("session id", &opts.session_id)?;
        let (tmp, workdir) = match &opts.workdir {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("could not create {}", dir.display()))?;
                (None, dir.clone())
            }
            None => {
                let tmp = tempfile::Builder::new()
                    .prefix("hosted-boot-coordinator-")
                    .tempdir()
                    .context("could not create a temporary directory")?;
                let dir = tmp.path().to_path_buf();
                (Some(tmp), dir)
            }
        };
        let repo = {
            let (source, workdir) = (opts.source_repo.clone(), workdir.clone());
            let (name, branch, create) = (
                opts.repo_full_name.clone(),
                opts.branch.clone(),
                opts.create_branch,
            );
            tokio::task::spawn_blocking(move || {
                let source = match source {
                    Some(s) => s,
                    None => create_sample_repo(&workdir.join("sample"))?,
                };
                git::prepare_bare_repo(&workdir, &source, &name, &branch, create)
            })
            .await
            .context("repository setup panicked")??
        };

        let listener = tokio::net::TcpListener::bind(opts.listen)
            .await
            .with_context(|| format!("could not listen on {}", opts.listen))?;
        let local_addr = listener.local_addr()?;
        let base_url = advertised_url(&opts, local_addr)?;
        let dev_token =
            (!local_addr.ip().is_loopback()).then(|| Secret::new(state::random_hex(16)));

        let shared = Arc::new(server::Shared {
            cfg: server_config(&opts, repo, dev_token),
            state: Mutex::new(initial_state(&opts)),
            changed: tokio::sync::Notify::new(),
        });

        let fleet = Arc::new(fleet::Fleet::new(base_url.clone(), shared.clone()));
        if opts.sessions > 1 {
            let (f, more, idle) = (fleet.clone(), opts.sessions - 1, opts.start_idle);
            tokio::task::spawn_blocking(move || (0..more).try_for_each(|_| f.add(idle).map(drop)))
                .await
                .context("adding sessions panicked")??;
        }
        let app =
            server::router(fleet.clone()).into_make_service_with_connect_info::<conn::ConnHandle>();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let serve = axum::serve(conn::KillableListener(listener), app).with_graceful_shutdown(
                async move {
                    let _ = rx.await;
                },
            );
            if let Err(e) = serve.await {
                tracing::warn!(error = %e, "coordinator: server stopped");
            }
        });
        Ok(Coordinator {
            shared,
            fleet,
            base_url,
            local_addr,
            shutdown_tx: Mutex::new(Some(tx)),
            task: Mutex::new(Some(task)),
            _tmp: tmp,
        })
    }

    /// The API base URL (`ORIZU_API_BASE_URL`), with a trailing slash, e.g.
    /// `http://127.0.0.1:41234/`.
    pub fn base_url(&self) -> Url {
        self.base_url.clone()
    }

    /// The address the server is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// `ORIZU_AGENT_TOKEN_URL`: where this coordinator serves the agent-token
    /// route (`{base}api/cli/sessions/{sid}/agent-token`, its row of the
    /// route table).
    pub fn agent_token_url(&self) -> String {
        self.route_url(Route::AgentToken)
    }

    /// `ORIZU_BOOT_STATUS_URL`: where this coordinator serves the boot-status
    /// route (`{base}api/cli/sessions/{sid}/boot-status`).
    pub fn boot_status_url(&self) -> String {
        self.route_url(Route::BootStatus)
    }

    fn route_url(&self, route: Route) -> String {
        format!(
            "{}{}",
            self.base_url,
            route.path(&self.shared.cfg.session_id)
        )
    }

    /// The git base (`HOSTED_BOOT_GIT_BASE_URL`): `{base}git`, no trailing
    /// slash; the clone URL is `{git base}/{repoFullName}.git`.
    pub fn git_base_url(&self) -> String {
        format!("{}git", self.base_url)
    }

    /// The clone URL of the served repository (no credentials).
    pub fn clone_url(&self) -> String {
        format!(
            "{}/{}.git",
            self.git_base_url(),
            self.shared.cfg.repo_full_name
        )
    }

    /// Adds a session to the fleet (`POST dev/sessions`): id
    /// `{session_id}-{n}`, a branch of its own, its initial task pending
    /// unless `start_idle`. Returns its id.
    ///
    /// Errors: its branch cannot be created in the bare repository.
    pub fn add_session(&self, start_idle: bool) -> anyhow::Result<String> {
        Ok(self.fleet.add(start_idle)?.cfg.session_id.clone())
    }

    /// The environment a sandbox on session `sid` of the fleet needs, as
    /// [`Coordinator::sandbox_env`] gives it for the first; `None` for an
    /// unknown session. Holds its boot secret: never log it.
    pub fn session_env(&self, sid: &str) -> Option<Vec<(String, String)>> {
        self.fleet
            .session(sid)
            .map(|sh| self.fleet.sandbox_env(&sh))
    }

    /// Stores `state` as the session's saved agent state (2.7), as a save
    /// would, without checking it: tests serve corrupt states too.
    pub fn set_agent_state(&self, state: Option<serde_json::Value>) {
        self.shared.update(|st| st.agent_state = state);
    }

    /// A consistent copy of session `sid`'s state (its requests included);
    /// `None` for an unknown session.
    pub fn session_snapshot(&self, sid: &str) -> Option<Snapshot> {
        self.fleet.session(sid).map(|sh| sh.snapshot())
    }

    /// The session id.
    pub fn session_id(&self) -> String {
        self.shared.cfg.session_id.clone()
    }

    /// The session branch.
    pub fn branch(&self) -> String {
        self.shared.cfg.branch.clone()
    }

    /// The environment a sandbox needs (PROTOCOL.md section 1), in this order:
    /// `ORIZU_BOOT_SECRET`, `ORIZU_AGENT_TOKEN_URL`, `ORIZU_API_BASE_URL`,
    /// `ORIZU_SESSION_ID`, `ORIZU_BOOT_STATUS_URL`, `HOSTED_BOOT_GIT_BASE_URL`.
    /// Holds the boot secret: never log it.
    pub fn sandbox_env(&self) -> Vec<(String, String)> {
        vec![
            ("ORIZU_BOOT_SECRET".into(), self.boot_secret()),
            ("ORIZU_AGENT_TOKEN_URL".into(), self.agent_token_url()),
            ("ORIZU_API_BASE_URL".into(), self.base_url.to_string()),
            ("ORIZU_SESSION_ID".into(), self.session_id()),
            ("ORIZU_BOOT_STATUS_URL".into(), self.boot_status_url()),
            ("HOSTED_BOOT_GIT_BASE_URL".into(), self.git_base_url()),
        ]
    }

    /// The boot secret (64 hex characters).
    pub fn boot_secret(&self) -> String {
        self.shared.cfg.boot_secret.expose().to_string()
    }

    /// The dev API token, required when listening on a non-loopback address
    /// (`Authorization: Bearer <token>`); `None` on loopback.
    pub fn dev_token(&self) -> Option<String> {
        self.shared
            .cfg
            .dev_token
            .as_ref()
            .map(|t| t.expose().to_string())
    }

    /// Every secret the runner could see: the boot secret, then every bearer
    /// and repo token issued so far, in order. Tests grep logs and files for
    /// them.
    pub fn issued_secrets(&self) -> Vec<String> {
        let mut out = vec![self.boot_secret()];
        out.extend(self.shared.lock().issued.iter().cloned());
        out
    }

    /// Every bearer issued so far (no repo token, not the boot secret), in
    /// no particular order: what must never reach the agent in proxy mode.
    pub fn issued_bearers(&self) -> Vec<String> {
        self.shared.lock().bearer_tokens()
    }

    /// Expires the bearers `tokens` now (what a pause that outlasted them
    /// leaves): every later use of one is answered `401`.
    pub fn expire_bearers(&self, tokens: &[String]) {
        self.shared.update(|st| st.expire_bearers(tokens));
    }

    /// The bare repository served (`…/git/{owner}/{name}.git`).
    pub fn bare_repo(&self) -> PathBuf {
        self.shared.cfg.repo.path.clone()
    }

    /// The branch the bare repository's `HEAD` names.
    pub fn default_branch(&self) -> String {
        self.shared.cfg.repo.default_branch.clone()
    }

    /// Queues a turn (`POST dev/turns`): creates run `run-<ordinal>` as
    /// `pending` and returns its id.
    pub fn queue_turn(&self, body: &str, answer: Option<AnswerToQuestion>) -> String {
        self.shared
            .update(|st| st.queue_turn(body.to_string(), answer))
    }

    /// [`Coordinator::queue_turn`] whose `pendingTurn` carries `traceparent`
    /// (`POST dev/turns` with `traceparent`).
    pub fn queue_traced_turn(&self, body: &str, traceparent: &str) -> String {
        self.shared.update(|st| {
            let id = st.queue_turn(body.to_string(), None);
            st.trace_run(&id, Some(traceparent.to_string()));
            id
        })
    }

    /// Requests an interrupt (`POST dev/interrupt`): sets
    /// `interruptRequestedRunId` to `run_id`, or to the `running` run.
    /// Returns the run id.
    ///
    /// Errors: no run is `running` (when `run_id` is `None`), unknown run, run
    /// already sealed.
    pub fn interrupt(&self, run_id: Option<&str>) -> Result<String, DevError> {
        self.shared.update(|st| st.interrupt(run_id))
    }

    /// Ends the session (`POST dev/end`): `status` becomes `ended`.
    pub fn end_session(&self) {
        self.shared.update(|st| st.status = "ended".into());
    }

    /// Queues a fault (`POST dev/faults`).
    ///
    /// Errors: a fault that does nothing, a `count` of 0, a status outside
    /// 200..=599, a route that takes no faults (`dev`, `unknown`).
    pub fn add_fault(&self, fault: Fault) -> Result<(), DevError> {
        self.shared.add_fault(fault)
    }

    /// Sets the git server's file size limit (`POST dev/git`): a push that
    /// brings a file (blob) larger than `bytes` is refused whole; `None`
    /// lifts the limit.
    pub fn set_git_max_file_size(&self, bytes: Option<u64>) {
        self.shared.update(|st| st.git_max_file_size = bytes);
    }

    /// Serves a bare clone of the repository at `source` as `full_name`
    /// (`owner/name`) beside the session's, read-only to the session's repo
    /// tokens (a submodule's repository, PROTOCOL.md section 6 "Git");
    /// returns its clone URL.
    ///
    /// Errors: an invalid or taken name, a failing `git`.
    pub fn add_repository(&self, full_name: &str, source: &Path) -> anyhow::Result<String> {
        self.shared.cfg.served.add_repository(
            &self.shared.cfg.repo.project_root,
            full_name,
            source,
        )?;
        Ok(format!("{}/{full_name}.git", self.git_base_url()))
    }

    /// Holds `content` as a Git LFS object that the batch API of every
    /// served repository offers for download (PROTOCOL.md section 6
    /// "Git"); returns its oid (sha256, hex). A pointer to it is
    /// [`lfs_pointer`].
    pub fn add_lfs_object(&self, content: &[u8]) -> String {
        self.shared.cfg.served.add_lfs_object(content)
    }

    /// Sets the session's `setup` field (`POST dev/setup`); `None` removes
    /// it.
    pub fn set_setup(&self, setup: Option<crate::wire::SessionSetup>) {
        self.shared.update(|st| st.setup = setup);
    }

    /// Sets the session's `egressCanary` and `instructions` (PROTOCOL.md
    /// 2.4 extensions; `POST dev/around-agent`), as the next session read
    /// serves them.
    pub fn set_around_agent(&self, egress_canary: Option<String>, instructions: Option<String>) {
        self.shared.update(|st| {
            st.around = state::AroundAgent {
                egress_canary,
                instructions,
            }
        });
    }

    /// Drops every fault not used up yet (`DELETE dev/faults`).
    pub fn clear_faults(&self) {
        self.shared.update(|st| st.faults.clear());
    }

    /// Every request received, in order (`GET dev/requests`).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.lock().requests.clone()
    }

    /// The requests received from index `from` on (in order of arrival).
    pub fn requests_since(&self, from: usize) -> Vec<RecordedRequest> {
        self.shared
            .lock()
            .requests
            .get(from..)
            .map(<[RecordedRequest]>::to_vec)
            .unwrap_or_default()
    }

    /// The request at `index` (in order of arrival), as it is now.
    pub fn request(&self, index: usize) -> Option<RecordedRequest> {
        self.shared.lock().requests.get(index).cloned()
    }

    /// The boot statuses posted, in order.
    pub fn statuses(&self) -> Vec<BootStatusBody> {
        self.shared.lock().statuses.clone()
    }

    /// The run `run_id`: status, events, seal.
    pub fn run(&self, run_id: &str) -> Option<RunRecord> {
        self.shared.lock().run(run_id).cloned()
    }

    /// Milliseconds since the coordinator started (the clock of
    /// [`RecordedRequest::at_ms`]).
    pub fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.shared.lock().started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Waits at most `timeout` for the next change of the state (a request,
    /// a control call), for a live view of the record.
    pub async fn changed(&self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.shared.changed.notified()).await;
    }

    /// A consistent copy of the whole state.
    pub fn snapshot(&self) -> Snapshot {
        self.shared.snapshot()
    }

    /// `GET dev/state` as JSON: `{"session": {…}, "statuses": […], "runs":
    /// […], "faults": […]}`.
    pub fn state_json(&self) -> serde_json::Value {
        serde_json::to_value(self.snapshot()).unwrap_or(serde_json::Value::Null)
    }

    /// Waits until `cond` holds for the state, re-checking at every change
    /// (each request, each control call); returns the snapshot that satisfied
    /// it.
    ///
    /// Errors: [`DevError::Timeout`] after `timeout`, carrying the last state.
    pub async fn wait_for<F>(&self, timeout: Duration, mut cond: F) -> Result<Snapshot, DevError>
    where
        F: FnMut(&Snapshot) -> bool,
    {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.shared.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let snap = self.snapshot();
            if cond(&snap) {
                return Ok(snap);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, notified).await.is_err() {
                return Err(DevError::Timeout {
                    waited: timeout,
                    state: serde_json::to_string(&snap).unwrap_or_default(),
                });
            }
        }
    }

    /// The start-up text of PROTOCOL.md section 6: the base URL, the
    /// repository, an `env …` line and a `docker run --network host -e …`
    /// line with the sandbox's environment, and `curl` lines for the dev API.
    /// Holds the boot secret (it is what a person copies into a sandbox).
    /// The `env …` line runs `runner` (see [`runner_binary::find`]).
    pub fn startup_text(&self, runner: &Path) -> String {
        cli::startup_text(self, runner)
    }

    /// Stops the server: no new connections, requests in flight get up to
    /// 2 s, then everything is dropped.
    pub async fn shutdown(&self) {
        let tx = crate::lock(&self.shutdown_tx).take();
        if let Some(tx) = tx {
            let _ = tx.send(());
        }
        let task = crate::lock(&self.task).take();
        if let Some(mut task) = task
            && tokio::time::timeout(Duration::from_secs(2), &mut task)
                .await
                .is_err()
        {
            task.abort();
        }
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        let task = crate::lock(&self.task).take();
        if let Some(task) = task {
            task.abort();
        }
    }
}

/// The base URL sandboxes are given: `--advertise-url`, else the listening
/// address (an unspecified one as loopback).
fn advertised_url(opts: &CoordinatorOptions, local_addr: SocketAddr) -> anyhow::Result<Url> {
    let base_url = match &opts.advertise_url {
        Some(u) => u.clone(),
        None => {
            let ip = match local_addr.ip() {
                IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
                ip => ip,
            };
            Url::parse(&format!(
                "http://{}/",
                SocketAddr::new(ip, local_addr.port())
            ))?
        }
    };
    if !base_url.path().ends_with('/') {
        anyhow::bail!("the advertised URL {base_url} must end with /");
    }
    Ok(base_url)
}

/// What the session's server answers with and never changes: from the
/// options, the served repository and the dev token.
fn server_config(
    opts: &CoordinatorOptions,
    repo: git::BareRepo,
    dev_token: Option<Secret>,
) -> server::Config {
    server::Config {
        session_id: opts.session_id.clone(),
        workspace_id: opts.workspace_id.clone(),
        repo_full_name: opts.repo_full_name.clone(),
        branch: opts.branch.clone(),
        client_info: ClientInfo {
            task: opts.task.clone(),
            model: opts.model.clone(),
            reasoning_effort: opts.reasoning_effort.clone(),
            surface: opts.surface.clone(),
            duration_minutes: opts.duration_minutes,
        },
        connectors: opts.connectors.clone(),
        redact_vars: opts.redact_vars.clone(),
        setup_connectors: opts.setup_connectors.clone(),
        bearer_ttl: opts.bearer_ttl,
        clock_offset_s: opts.clock_offset_s,
        bearer_expires_in_s: opts.bearer_expires_in_s,
        repo_token_ttl: opts.repo_token_ttl,
        repo_token_expires_at: opts.repo_token_expires_at,
        boot_secret: Secret::new(state::random_hex(32)),
        dev_token,
        long_poll: opts.long_poll,
        repo,
        served: served::Served::default(),
        latency: opts.latency,
        counts_only: opts.counts_only,
    }
}

/// The session's first state: its initial run (unless it starts idle) and
/// what the dev API can change later.
fn initial_state(opts: &CoordinatorOptions) -> state::State {
    let mut s = state::State::new((!opts.start_idle).then_some(opts.task.as_str()));
    s.agent_session_id = opts.agent_session_id.clone();
    s.git_max_file_size = opts.git_max_file_size;
    s.setup = opts.setup.clone();
    s.around = state::AroundAgent {
        egress_canary: opts.egress_canary.clone(),
        instructions: opts.instructions.clone(),
    };
    s.accepts_released = opts.accepts_released;
    s.agent_state_offer = opts
        .agent_state_max_bytes
        .map(|max| crate::wire::AgentStateOffer {
            max_bytes: max.min(server::MAX_API_BODY as u64),
        });
    s
}
