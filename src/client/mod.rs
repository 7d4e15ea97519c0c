//! The coordinator client: one method per route of PROTOCOL.md section 2,
//! every one under the retry engine of [`retry`] with the [`Policy`] of its
//! row of the retry table named where it is sent (the routes used in more
//! than one place take theirs from the caller, who names it), bearer routes
//! with the "expired bearer" rule (a `401` pulls a fresh bearer once and
//! repeats).
//!
//! New bearers are published on a watch channel (the turn's rotation writes
//! them to the bearer file) and added to the redactor before any use.

pub mod bearer;
pub mod long_poll;
pub mod retry;
#[cfg(test)]
mod retry_table;

use std::time::{Duration, SystemTime};

use reqwest::{RequestBuilder, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

pub use bearer::Bearer;
pub use long_poll::LongPoll;
pub use retry::{CallError, Policy, Reply, caps};

use crate::redact::{Redactor, SecretKind};
use crate::secret::Secret;
use crate::timings::Timings;
use crate::wire::routes::{self, Auth, EmptyObject, Endpoint, Location, Route};
use crate::wire::{
    self, Access, AgentStateAnswer, BootStatus, BootStatusBody, EnvBundle, FinishBody,
    RepoTokenRequest, RepoTokenResponse, Session,
};

/// Where the coordinator is and how to authenticate to it.
#[derive(Clone)]
pub struct ApiConfig {
    /// `ORIZU_API_BASE_URL`, with a trailing slash.
    pub api_base: Url,
    /// `ORIZU_AGENT_TOKEN_URL`.
    pub agent_token_url: Url,
    /// `ORIZU_BOOT_STATUS_URL` (or its default).
    pub boot_status_url: Url,
    /// `ORIZU_SESSION_ID` (path-safe).
    pub session_id: String,
    /// The boot secret.
    pub boot_secret: Secret,
}

/// A repository token (2.5).
#[derive(Clone, Debug)]
pub struct RepoToken {
    /// The token.
    pub token: Secret,
    /// When it expires, epoch milliseconds by the coordinator's clock
    /// corrected to local time; `None` when the answer had no `expiresAt`.
    pub expires_at: Option<SystemTime>,
    /// `owner/name`, when the remote is on the git base.
    pub repo_full_name: Option<String>,
    /// A checked artifacts remote, when given instead.
    pub artifacts_remote: Option<String>,
}

/// The coordinator client. Cheap to share behind an `Arc`.
pub struct Api {
    config: ApiConfig,
    http: reqwest::Client,
    timings: Timings,
    redactor: Redactor,
    bearer: watch::Sender<Option<Bearer>>,
    contact_hook: Option<ContactHook>,
    refresh: Policy,
    pace: std::sync::Arc<dyn retry::Pace>,
}

/// Called after each call to the coordinator with whether it succeeded (the
/// status file records contacts with it).
pub type ContactHook = std::sync::Arc<dyn Fn(bool) + Send + Sync>;

impl Api {
    /// A client; the boot secret is added to `redactor` at once.
    pub fn new(
        config: ApiConfig,
        http: reqwest::Client,
        timings: Timings,
        redactor: Redactor,
    ) -> Api {
        redactor.add(&config.boot_secret, SecretKind::Credential);
        Api {
            config,
            http,
            timings,
            redactor,
            bearer: watch::channel(None).0,
            contact_hook: None,
            refresh: Policy::AGENT_TOKEN_REFRESH,
            pace: std::sync::Arc::new(retry::RealPace),
        }
    }

    /// Sets the policy of the bearer pull a bearer route makes when it has
    /// none, or after a `401` ([`Policy::AGENT_TOKEN_REFRESH`] unless set):
    /// `hosted-boot check` makes one attempt per route.
    pub fn with_bearer_refresh(mut self, policy: Policy) -> Api {
        self.refresh = policy;
        self
    }

    /// Sets how the retry engine waits and draws its jitter (tests record
    /// the waits instead of sleeping; production uses [`retry::REAL`]).
    pub fn with_pace(mut self, pace: std::sync::Arc<dyn retry::Pace>) -> Api {
        self.pace = pace;
        self
    }

    /// Sends under `policy`, scaled by this client's timings (see
    /// [`Policy::scaled`]), through the engine, and notes the contact.
    async fn send<T>(
        &self,
        call: &str,
        policy: Policy,
        cap: usize,
        build: impl Fn() -> RequestBuilder,
        accept: impl Fn(Reply) -> Result<T, String>,
    ) -> Result<T, CallError> {
        let policy = policy.scaled(self.timings.scale);
        let result = retry::send(call, policy, &*self.pace, cap, build, accept).await;
        self.noted(result)
    }

    /// Sets the hook called after every call (see [`ContactHook`]).
    pub fn with_contact_hook(mut self, hook: ContactHook) -> Api {
        self.contact_hook = Some(hook);
        self
    }

    fn noted<T>(&self, result: Result<T, CallError>) -> Result<T, CallError> {
        if let Some(hook) = &self.contact_hook {
            hook(result.is_ok());
        }
        result
    }

    /// The timings this client uses.
    pub fn timings(&self) -> &Timings {
        &self.timings
    }

    /// The redactor every value this client mints is added to.
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// The current bearer, if one was pulled.
    pub fn bearer(&self) -> Option<Bearer> {
        self.bearer.borrow().clone()
    }

    /// The bearer to use now (PROTOCOL.md 2.1, "Clocks"): the current one,
    /// or a fresh one pulled first (under the bearer-pull policy, see
    /// [`Api::with_bearer_refresh`]) when none was pulled yet or the wall
    /// clock jumped ahead of the monotonic clock since the pull (a sandbox
    /// paused and restored: the bearer may have expired meanwhile).
    ///
    /// Errors: as [`Api::pull_bearer`].
    pub async fn usable_bearer(&self) -> Result<Bearer, CallError> {
        match self.bearer() {
            Some(b) if !b.clock_jumped() => Ok(b),
            Some(b) => {
                tracing::warn!(
                    jump_ms = u64::try_from(b.clock_jump().as_millis()).unwrap_or(u64::MAX),
                    "the wall clock ran ahead of the monotonic clock since the bearer was pulled (a pause and restore); pulling a fresh bearer before using it"
                );
                self.pull_bearer(self.refresh).await
            }
            None => self.pull_bearer(self.refresh).await,
        }
    }

    /// Subscribes to bearer changes (the turn's rotation writes each new one
    /// to the bearer file).
    pub fn subscribe_bearer(&self) -> watch::Receiver<Option<Bearer>> {
        self.bearer.subscribe()
    }

    /// The URL of `route` ([`routes::TABLE`]): the one the environment
    /// injects, or the route's path with its parameter `id` under the API
    /// base.
    fn url(&self, route: Route, id: &str) -> Url {
        match route.spec().location {
            Location::AgentTokenUrl => self.config.agent_token_url.clone(),
            Location::BootStatusUrl => self.config.boot_status_url.clone(),
            // Ids are path-safe (PROTOCOL.md 5), so the join cannot fail.
            Location::ApiBase => self
                .config
                .api_base
                .join(&route.path(id))
                .unwrap_or_else(|_| self.config.api_base.clone()),
        }
    }

    /// The request of `route` as the table says: its method, its URL (see
    /// [`Api::url`]) and its credential, the boot secret or `bearer`
    /// (`None` only for the boot-secret routes, which ignore it).
    fn build(&self, route: Route, id: &str, bearer: Option<&Secret>) -> RequestBuilder {
        let spec = route.spec();
        let method = match spec.method {
            routes::Method::Get => reqwest::Method::GET,
            routes::Method::Post => reqwest::Method::POST,
        };
        let request = self.http.request(method, self.url(route, id));
        match (spec.auth, bearer) {
            (Auth::BootSecret, _) => request.bearer_auth(self.config.boot_secret.expose()),
            (Auth::Bearer, Some(token)) => request.bearer_auth(token.expose()),
            // A caller's bug; the coordinator answers 401.
            (Auth::Bearer, None) => request,
        }
    }

    /// [`Api::build`] with the JSON body the endpoint's row names.
    fn build_json<Q: Serialize, R>(
        &self,
        endpoint: Endpoint<Q, R>,
        id: &str,
        bearer: Option<&Secret>,
        body: &Q,
    ) -> RequestBuilder {
        self.build(endpoint.route(), id, bearer).json(body)
    }

    /// Pulls a fresh bearer (2.1) with the boot secret and publishes it.
    /// `policy`: [`Policy::AGENT_TOKEN_BOOT`] at boot,
    /// [`Policy::AGENT_TOKEN_REFRESH`] later, [`Policy::CREDENTIAL_HELPER`]
    /// in the credential helper.
    ///
    /// Errors: exhausted attempts (the text starts `agent-token pull failed
    /// after N attempts`), [`CallError::BootSecretRefused`] for a `401` or
    /// `403` (the boot secret is no longer valid), another verdict.
    pub async fn pull_bearer(&self, policy: Policy) -> Result<Bearer, CallError> {
        let call = "agent-token pull";
        let e = routes::AGENT_TOKEN;
        let sid = &self.config.session_id;
        let reply = self
            .send(
                call,
                policy,
                e.spec().cap,
                || self.build(e.route(), sid, None),
                Ok,
            )
            .await
            .map_err(boot_secret_refused)?;
        let date = reply.date();
        let response = decode(call, e, &reply)?;
        if response.token.is_empty() {
            return Err(bad(call, "the token is empty"));
        }
        let bearer = Bearer::from_response(response, date);
        self.redactor.add(&bearer.token, SecretKind::Credential);
        self.bearer.send_replace(Some(bearer.clone()));
        Ok(bearer)
    }

    /// Sends a bearer-authenticated request; a `401` pulls a fresh bearer
    /// once and repeats the request once (PROTOCOL.md 2, "Expired bearer").
    async fn authed(
        &self,
        call: &str,
        policy: Policy,
        cap: usize,
        build: impl Fn(&Secret) -> RequestBuilder,
    ) -> Result<Reply, CallError> {
        self.authed_with(call, policy, cap, build, Ok).await
    }

    /// [`Api::authed`], the 2xx answer judged by `accept` (see
    /// [`retry::send`]).
    async fn authed_with<T>(
        &self,
        call: &str,
        policy: Policy,
        cap: usize,
        build: impl Fn(&Secret) -> RequestBuilder,
        accept: impl Fn(Reply) -> Result<T, String>,
    ) -> Result<T, CallError> {
        let bearer = self.usable_bearer().await?;
        let first = self
            .send(call, policy, cap, || build(&bearer.token), &accept)
            .await;
        match first {
            Err(e) if e.verdict_status() == Some(401) => {
                tracing::info!(call, "bearer refused (401); pulling a fresh bearer once");
                let fresh = self.pull_bearer(self.refresh).await?;
                self.send(call, policy, cap, || build(&fresh.token), &accept)
                    .await
            }
            other => other,
        }
    }

    /// Posts a boot status (2.2) with the boot secret. `ready` is sent
    /// without `runId`; `reason` is redacted and cut to 800 characters.
    /// Required statuses use [`Policy::REQUIRED`], the others
    /// [`Policy::BEST_EFFORT`].
    ///
    /// Errors: as [`retry::send`].
    pub async fn post_status(
        &self,
        status: BootStatus,
        run_id: Option<&str>,
        reason: Option<&str>,
    ) -> Result<(), CallError> {
        let policy = if status.is_required() {
            Policy::REQUIRED
        } else {
            Policy::BEST_EFFORT
        };
        self.post_status_with(status, run_id, reason, policy).await
    }

    /// [`Api::post_status`] with an explicit policy (the graceful stop of
    /// PROTOCOL.md 4.4 posts `turn_completed` once: [`Policy::ONCE`]).
    pub async fn post_status_with(
        &self,
        status: BootStatus,
        run_id: Option<&str>,
        reason: Option<&str>,
        policy: Policy,
    ) -> Result<(), CallError> {
        let body = BootStatusBody {
            status,
            run_id: match status {
                BootStatus::Ready => None,
                _ => Some(run_id.map(str::to_string)),
            },
            reason: reason.map(|r| wire::truncate_reason(&self.redactor.redact(r))),
        };
        let call = format!("boot status \"{}\"", status.as_str());
        let e = routes::BOOT_STATUS;
        let sid = &self.config.session_id;
        self.send(
            &call,
            policy,
            e.spec().cap,
            || self.build_json(e, sid, None, &body),
            Ok,
        )
        .await
        .map(|_| ())
    }

    /// Fetches the env bundle (2.3).
    pub async fn env_bundle(&self) -> Result<EnvBundle, CallError> {
        let call = "env bundle";
        let e = routes::ENV_BUNDLE;
        let sid = &self.config.session_id;
        let reply = self
            .authed(call, Policy::BOOT_FETCH, e.spec().cap, |t| {
                self.build(e.route(), sid, Some(t))
            })
            .await?;
        decode(call, e, &reply)
    }

    /// Reads the session (2.4) under `policy` ([`Policy::BOOT_FETCH`] at
    /// boot, [`Policy::PER_TICK`] between turns). `during_turn` adds the
    /// interrupt watch's header. The pending turn's shape is checked by the
    /// caller ([`Session::pending_turn`]).
    pub async fn session(&self, policy: Policy, during_turn: bool) -> Result<Session, CallError> {
        let call = "session read";
        let e = routes::SESSION;
        let sid = &self.config.session_id;
        let reply = self
            .authed(call, policy, e.spec().cap, |t| {
                let r = self.build(e.route(), sid, Some(t));
                if during_turn {
                    r.header(wire::DURING_TURN_HEADER.0, wire::DURING_TURN_HEADER.1)
                } else {
                    r
                }
            })
            .await?;
        decode(call, e, &reply).map(|e| e.session)
    }

    /// Reads the session once with the bearer of the bearer file, without
    /// the 401 re-pull (the interrupt watch, PROTOCOL.md 2 "Expired bearer").
    pub async fn session_with(&self, token: &Secret) -> Result<Session, CallError> {
        let call = "interrupt watch read";
        let e = routes::SESSION;
        let sid = &self.config.session_id;
        let reply = self
            .send(
                call,
                Policy::PER_TICK,
                e.spec().cap,
                || {
                    self.build(e.route(), sid, Some(token))
                        .header(wire::DURING_TURN_HEADER.0, wire::DURING_TURN_HEADER.1)
                },
                Ok,
            )
            .await?;
        decode(call, e, &reply).map(|e| e.session)
    }

    /// Reads the session once for a reader that keeps `poll` between its
    /// reads, with the long-poll preference of PROTOCOL.md 2.4: the interrupt
    /// watch (`token`: the bearer file's, no 401 re-pull, the during-turn
    /// header) or the wait between turns (`token` `None`: the current bearer
    /// and the 401 re-pull). `Ok(None)`: unchanged since the last answer
    /// (`304`). A read the coordinator may hold has a per-attempt timeout of
    /// the wait plus the usual one.
    ///
    /// Errors: as [`Api::session`].
    pub async fn session_poll(
        &self,
        poll: &mut LongPoll,
        token: Option<&Secret>,
    ) -> Result<Option<Session>, CallError> {
        let call = match token {
            Some(_) => "interrupt watch read",
            None => "session read",
        };
        let e = routes::SESSION;
        let sid = &self.config.session_id;
        let wait_secs = LongPoll::wait_secs(&self.timings);
        // `send` scales the policy; the wait is already scaled.
        let policy = if poll.may_hold() {
            Policy {
                timeout: Some(
                    crate::timings::REQUEST_TIMEOUT
                        + Duration::from_secs(wait_secs).div_f64(self.timings.scale),
                ),
                ..Policy::PER_TICK
            }
        } else {
            Policy::PER_TICK
        };
        poll.start();
        let poll_ref = &*poll;
        let build = |t: &Secret| {
            let r = self.build(e.route(), sid, Some(t));
            let r = match token {
                Some(_) => r.header(wire::DURING_TURN_HEADER.0, wire::DURING_TURN_HEADER.1),
                None => r,
            };
            poll_ref.headers(r, wait_secs)
        };
        let reply = match token {
            Some(t) => self.send(call, policy, e.spec().cap, || build(t), Ok).await,
            None => self.authed(call, policy, e.spec().cap, build).await,
        };
        let decoded = reply.and_then(|reply| {
            if reply.status == reqwest::StatusCode::NOT_MODIFIED {
                return Ok((reply, None));
            }
            let session = decode(call, e, &reply)?.session;
            Ok((reply, Some(session)))
        });
        match decoded {
            Ok((reply, session)) => {
                poll.answered(&reply);
                Ok(session)
            }
            Err(e) => {
                poll.failed();
                Err(e)
            }
        }
    }

    /// Mints a repository token (2.5) under `policy` ([`Policy::BOOT_FETCH`]
    /// at boot, [`Policy::CREDENTIAL_HELPER`] in the helper) and adds it to
    /// the redactor.
    ///
    /// Errors: as [`retry::send`]; a response with neither `repoFullName`
    /// nor a valid `artifactsRemote` is [`CallError::BadResponse`].
    pub async fn repo_token(&self, access: Access, policy: Policy) -> Result<RepoToken, CallError> {
        let call = "repo-token mint";
        let e = routes::REPO_TOKEN;
        let sid = &self.config.session_id;
        let body = RepoTokenRequest { access };
        let reply = self
            .authed(call, policy, e.spec().cap, |t| {
                self.build_json(e, sid, Some(t), &body)
            })
            .await?;
        let date = reply.date();
        let response = decode(call, e, &reply)?;
        repo_token_from(call, response, date, &self.redactor)
    }

    /// `run_started` (2.6): required, idempotent.
    pub async fn run_started(&self, run_id: &str) -> Result<(), CallError> {
        let e = routes::RUN_STARTED;
        self.authed("run_started", Policy::REQUIRED, e.spec().cap, |t| {
            self.build_json(e, run_id, Some(t), &EmptyObject {})
        })
        .await
        .map(|_| ())
    }

    /// Posts a ready-made events body (`{"events":[…]}`, as read back from
    /// the run's spool) under [`Policy::EVENTS`] and returns
    /// `acceptedThrough`. The body is shared, not copied, between attempts.
    /// An answer whose `acceptedThrough` `progress` refuses (it accepted
    /// nothing of the batch), or whose body is not `{"acceptedThrough": n}`,
    /// is retried like a failure: resending at once would spin. The events
    /// policy has no attempt limit: the sender cuts this future at its flush
    /// deadline (PROTOCOL.md 2.6).
    ///
    /// Errors: a verdict (`413` included: the sender halves the batch) or a
    /// body over its cap, as [`retry::send`]; a failed bearer pull.
    pub async fn post_events_body(
        &self,
        run_id: &str,
        body: bytes::Bytes,
        progress: impl Fn(u64) -> bool,
    ) -> Result<u64, CallError> {
        let call = "events post";
        // The body is an `EventsBody` already encoded (the spool's lines).
        let e = routes::EVENTS;
        let accept = |reply: Reply| match decode(call, e, &reply) {
            Ok(a) if progress(a.accepted_through) => Ok(a.accepted_through),
            Ok(a) => Err(format!(
                "the coordinator accepted none of the batch (acceptedThrough {})",
                a.accepted_through
            )),
            Err(e) => Err(e.to_string()),
        };
        self.authed_with(
            call,
            Policy::EVENTS,
            e.spec().cap,
            |t| {
                self.build(e.route(), run_id, Some(t))
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone())
            },
            accept,
        )
        .await
    }

    /// Reads the events cursor (2.6).
    pub async fn events_cursor(&self, run_id: &str) -> Result<u64, CallError> {
        let call = "events cursor";
        let e = routes::CURSOR;
        let reply = self
            .authed(call, Policy::REQUIRED, e.spec().cap, |t| {
                self.build(e.route(), run_id, Some(t))
            })
            .await?;
        decode(call, e, &reply).map(|a| a.accepted_through)
    }

    /// Loads the session's saved agent state (2.7) under
    /// [`Policy::AGENT_STATE`]; the state is raw (the caller checks it).
    /// Only when the session offers it (`session.agentState`).
    pub async fn agent_state_load(&self) -> Result<AgentStateAnswer, CallError> {
        let call = "agent state load";
        let e = routes::AGENT_STATE_LOAD;
        let sid = &self.config.session_id;
        let reply = self
            .authed(call, Policy::AGENT_STATE, e.spec().cap, |t| {
                self.build(e.route(), sid, Some(t))
            })
            .await?;
        decode(call, e, &reply)
    }

    /// Saves the agent state (2.7) under [`Policy::AGENT_STATE`]: `body` is
    /// an [`crate::wire::AgentState`] already encoded and redacted (the
    /// caller checked its size against the offer), shared between attempts.
    pub async fn agent_state_save(&self, body: bytes::Bytes) -> Result<(), CallError> {
        let e = routes::AGENT_STATE_SAVE;
        let sid = &self.config.session_id;
        self.authed("agent state save", Policy::AGENT_STATE, e.spec().cap, |t| {
            self.build(e.route(), sid, Some(t))
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.clone())
        })
        .await
        .map(|_| ())
    }

    /// Seals a run (2.6 `finish`). Every string of the body is redacted here
    /// (PROTOCOL.md 5), the one place a finish is sent from: the agent's
    /// session id and `usage` (its model, keys included) come from what the
    /// agent printed or its server answered, the messages from errors;
    /// `error.message` and `result.pushError.message` are then cut to 800
    /// characters. `policy`: [`Policy::REQUIRED`], or [`Policy::ONCE`] on a
    /// graceful stop (4.4).
    pub async fn finish(
        &self,
        run_id: &str,
        body: &FinishBody,
        policy: Policy,
    ) -> Result<(), CallError> {
        let body = redacted_finish(&self.redactor, body);
        let e = routes::FINISH;
        self.authed("finish", policy, e.spec().cap, |t| {
            self.build_json(e, run_id, Some(t), &body)
        })
        .await
        .map(|_| ())
    }
}

/// `body` with every string redacted (see [`Client::finish`]); the enums
/// and numbers are the runner's own.
fn redacted_finish(redactor: &Redactor, body: &FinishBody) -> FinishBody {
    let mut body = body.clone();
    redactor.refresh();
    let text = |s: &mut String| *s = redactor.redact(s);
    if let Some(id) = body.agent_session_id.as_mut() {
        text(id);
    }
    if let Some(model) = body.usage.as_mut().and_then(|u| u.model.as_mut()) {
        text(model);
    }
    if let Some(error) = body.error.as_mut() {
        error.message = wire::truncate_reason(&redactor.redact(&error.message));
        if let Some(at) = error.resets_at.as_mut() {
            text(at);
        }
    }
    if let Some(reset) = body.agent_session_reset.as_mut() {
        text(&mut reset.requested);
        reset.reason = wire::truncate_reason(&redactor.redact(&reset.reason));
    }
    if let Some(result) = body.result.as_mut() {
        // Every string of the harvest report, whatever fields it grows
        // (paths of skipped files, recovery refs, …): by value, through its
        // JSON form, then the messages cut to their bound.
        match serde_json::to_value(&*result) {
            Ok(mut value) => {
                redactor.redact_value(&mut value);
                match serde_json::from_value::<wire::HarvestResult>(value) {
                    Ok(redacted) => *result = redacted,
                    Err(e) => {
                        tracing::error!(error = %e, "the redacted harvest report does not decode; sending none");
                        body.result = None;
                    }
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "the harvest report does not encode; sending none");
                body.result = None;
            }
        }
        if let Some(push_error) = body.result.as_mut().and_then(|r| r.push_error.as_mut()) {
            push_error.message = wire::truncate_reason(&push_error.message);
        }
    }
    body
}

/// Validates a 2.5 answer into a [`RepoToken`] and adds the token to the
/// redactor. Shared with the credential helper.
pub fn repo_token_from(
    call: &str,
    response: RepoTokenResponse,
    date: Option<SystemTime>,
    redactor: &Redactor,
) -> Result<RepoToken, CallError> {
    if response.token.is_empty() {
        return Err(bad(call, "the token is empty"));
    }
    let token = response.token;
    redactor.add(&token, SecretKind::Credential);
    if let Some(remote) = &response.artifacts_remote {
        crate::validate::artifacts_remote(remote).map_err(|source| CallError::Invalid {
            call: call.to_string(),
            source,
        })?;
    } else {
        match &response.repo_full_name {
            Some(name) => {
                crate::validate::repo_full_name(name).map_err(|source| CallError::Invalid {
                    call: call.to_string(),
                    source,
                })?;
            }
            None => {
                return Err(bad(
                    call,
                    "neither repoFullName nor artifactsRemote is given",
                ));
            }
        }
    }
    // Convert the coordinator's expiry to local time through its Date header.
    // An expiry no clock can hold (`1e300`, found by the fuzz target
    // `fuzz_repo_token`: it panicked here) is no known expiry: the token is
    // used, never cached.
    let expires_at = response
        .expires_at
        .and_then(|e| e.epoch_ms())
        .and_then(|ms| {
            let their_now = date.unwrap_or_else(SystemTime::now);
            let their_expiry = SystemTime::UNIX_EPOCH
                .checked_add(Duration::try_from_secs_f64(ms.max(0.0) / 1000.0).ok()?)?;
            let left = their_expiry
                .duration_since(their_now)
                .unwrap_or(Duration::ZERO);
            SystemTime::now().checked_add(left)
        });
    Ok(RepoToken {
        token,
        expires_at,
        repo_full_name: response.repo_full_name,
        artifacts_remote: response.artifacts_remote,
    })
}

/// A `401`/`403` of the agent-token pull as [`CallError::BootSecretRefused`].
fn boot_secret_refused(e: CallError) -> CallError {
    match e {
        CallError::Verdict {
            status: status @ (401 | 403),
            detail,
            ..
        } => CallError::BootSecretRefused { status, detail },
        other => other,
    }
}

/// The 2xx answer of `endpoint`, decoded as its row's answer type.
fn decode<Q, R: DeserializeOwned>(
    call: &str,
    _endpoint: Endpoint<Q, R>,
    reply: &Reply,
) -> Result<R, CallError> {
    crate::wire::decode::from_slice(&reply.body)
        .map_err(|e| bad(call, &format!("the body is not the expected JSON ({e})")))
}

fn bad(call: &str, reason: &str) -> CallError {
    CallError::BadResponse {
        call: call.to_string(),
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ErrorCode, FinishError, HarvestResult, RunOutcome};

    /// Every route of the table is built as its row says: the method, the
    /// URL (the injected one whole, or the path under the API base, whose
    /// own path is kept) and the credential.
    #[test]
    fn requests_are_built_from_the_route_table() {
        crate::tls::install_crypto_provider();
        let config = ApiConfig {
            api_base: Url::parse("https://plane.example/base/").unwrap(),
            agent_token_url: Url::parse("https://auth.example/t/s1/agent-token").unwrap(),
            boot_status_url: Url::parse("https://auth.example/t/s1/status").unwrap(),
            session_id: "s1".into(),
            boot_secret: Secret::new("boot-secret-1".into()),
        };
        let api = Api::new(
            config,
            reqwest::Client::new(),
            Timings::default(),
            Redactor::new(),
        );
        let bearer = Secret::new("bearer-1".into());
        for route in Route::all() {
            let spec = route.spec();
            let request = api.build(route, "id-1", Some(&bearer)).build().unwrap();
            assert_eq!(
                request.method().as_str(),
                spec.method.as_str(),
                "{}",
                spec.name
            );
            let url = match spec.location {
                Location::AgentTokenUrl => "https://auth.example/t/s1/agent-token".to_string(),
                Location::BootStatusUrl => "https://auth.example/t/s1/status".to_string(),
                Location::ApiBase => format!("https://plane.example/base/{}", route.path("id-1")),
            };
            assert_eq!(request.url().as_str(), url, "{}", spec.name);
            let credential = match spec.auth {
                Auth::BootSecret => "Bearer boot-secret-1",
                Auth::Bearer => "Bearer bearer-1",
            };
            assert_eq!(
                request.headers()[reqwest::header::AUTHORIZATION],
                credential,
                "{}",
                spec.name
            );
        }
        assert_eq!(
            api.build(Route::Finish, "run-7", Some(&bearer))
                .build()
                .unwrap()
                .url()
                .as_str(),
            "https://plane.example/base/api/cli/workbench-runs/run-7/finish"
        );
    }

    #[test]
    fn every_string_of_a_finish_is_redacted() {
        let redactor = Redactor::new();
        redactor.add(
            &Secret::new("acme-0123456789".into()),
            SecretKind::Configured,
        );
        // As an opencode server's JSON answer decodes them: never seen by
        // the redaction of the agent's output.
        let secret = "acme-0123456789";
        let body = FinishBody {
            status: RunOutcome::Failed,
            agent_session_id: Some(format!("ses-{secret}")),
            error: Some(FinishError {
                code: ErrorCode::AgentCrashed,
                message: format!("exit 1: {secret}"),
                retryable: false,
                retry_after_ms: None,
                resets_at: Some(secret.into()),
            }),
            usage: Some(wire::Usage {
                model: Some(secret.into()),
                input_tokens: Some(3),
                ..wire::Usage::default()
            }),
            result: Some(HarvestResult {
                name: secret.into(),
                branch: format!("b-{secret}"),
                head_sha: Some(secret.into()),
                pushed: true,
                commits: 0,
                files_changed: 0,
                insertions: 0,
                deletions: 0,
                harvest_commit: Some(secret.into()),
                recovery_branch: Some(secret.into()),
                push_error: None,
                skipped_files: vec![wire::SkippedFile {
                    path: format!("dir/{secret}.bin"),
                    bytes: 1,
                    reason: None,
                }],
                oversized_ref: Some(secret.into()),
                local_branch_recovery: Some(secret.into()),
                discarded_ref: Some(secret.into()),
                blocked_paths: vec![format!("dir/{secret}.env")],
                blocked_ref: Some(secret.into()),
                unpublished_gitlinks: vec![wire::UnpublishedGitlink {
                    path: format!("vendor/{secret}"),
                    commit: "c".repeat(40),
                    reason: wire::GitlinkReason::SubmoduleNotPushed,
                }],
            }),
            agent_session_reset: Some(wire::AgentSessionReset {
                requested: format!("ses-{secret}"),
                reason: format!("no conversation {secret}"),
            }),
            resources: None,
        };
        let sent = redacted_finish(&redactor, &body);
        let json = serde_json::to_string(&sent).unwrap();
        assert!(!json.contains(secret), "{json}");
        assert_eq!(sent.agent_session_id.as_deref(), Some("ses-[REDACTED]"));
        assert_eq!(
            sent.usage,
            Some(wire::Usage {
                model: Some("[REDACTED]".into()),
                input_tokens: Some(3),
                ..wire::Usage::default()
            })
        );
        assert_eq!(sent.status, RunOutcome::Failed);
    }
}
