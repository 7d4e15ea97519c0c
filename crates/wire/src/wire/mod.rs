//! The wire types of PROTOCOL.md section 2, defined once and used by both the
//! runner's client and the reference coordinator, so that the two cannot
//! drift. Field names are the contract: `camelCase` on the wire. The route
//! table (method, path, auth, URL source, body types, size cap of every
//! route) is [`routes`].

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::secret::Secret;

pub mod decode;
pub mod routes;
pub mod summary;

/// The header the interrupt watch adds to its session reads (2.4).
pub const DURING_TURN_HEADER: (&str, &str) = ("x-orizu-hosted-poll", "during-turn");

/// `expiresAt` of a bearer or repo token: RFC 3339 text, epoch milliseconds,
/// or null (2.1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ExpiresAt {
    /// Epoch milliseconds.
    EpochMs(f64),
    /// RFC 3339 text.
    Rfc3339(String),
}

impl ExpiresAt {
    /// The instant as milliseconds since the Unix epoch, or `None` when the
    /// text is not RFC 3339.
    pub fn epoch_ms(&self) -> Option<f64> {
        match self {
            ExpiresAt::EpochMs(ms) => Some(*ms),
            ExpiresAt::Rfc3339(text) => {
                let t = humantime::parse_rfc3339_weak(text).ok()?;
                let d = t.duration_since(std::time::UNIX_EPOCH).ok()?;
                Some(d.as_secs_f64() * 1000.0)
            }
        }
    }
}

/// 2.1 response: `{"token": "<bearer>", "expiresAt": … | null}`.
/// `Debug` prints the token as `[REDACTED]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentTokenResponse {
    /// The bearer (secret).
    #[serde(serialize_with = "crate::secret::serialize_exposed")]
    pub token: Secret,
    /// When it expires, by the coordinator's clock.
    #[serde(default)]
    pub expires_at: Option<ExpiresAt>,
}

/// Boot statuses (2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BootStatus {
    /// Boot finished, nothing to run yet (required).
    Ready,
    /// A turn starts (required).
    TurnStarted,
    /// A turn was sealed (required).
    TurnCompleted,
    /// The runner failed after the drain began (required).
    TurnFailed,
    /// Clean end of the session (best-effort).
    Complete,
    /// Fatal error before the drain (best-effort).
    Failed,
    /// The runner gives the session back, idle or retired, and exits; the
    /// next turn needs a new sandbox (required; only to a coordinator whose
    /// session says `acceptsReleased`, 2.4).
    Released,
}

impl BootStatus {
    /// Whether the status is a required acknowledgement (5 attempts) rather
    /// than best-effort (1 attempt).
    pub fn is_required(self) -> bool {
        match self {
            BootStatus::Ready
            | BootStatus::TurnStarted
            | BootStatus::TurnCompleted
            | BootStatus::TurnFailed
            | BootStatus::Released => true,
            BootStatus::Complete | BootStatus::Failed => false,
        }
    }

    /// The wire name (`turn_started`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            BootStatus::Ready => "ready",
            BootStatus::TurnStarted => "turn_started",
            BootStatus::TurnCompleted => "turn_completed",
            BootStatus::TurnFailed => "turn_failed",
            BootStatus::Complete => "complete",
            BootStatus::Failed => "failed",
            BootStatus::Released => "released",
        }
    }
}

/// 2.2 request body: `{"status": S, "runId": id | null, "reason"?}`;
/// `ready` is `{"status": "ready"}` (no `runId`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootStatusBody {
    /// The status.
    pub status: BootStatus,
    /// `None`: absent (only for `ready`); `Some(None)`: `null`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    pub run_id: Option<Option<String>>,
    /// At most 800 characters, redacted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

mod double_option {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Option<String>>, s: S) -> Result<S::Ok, S::Error> {
        v.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Option<String>>, D::Error> {
        Option::<String>::deserialize(d).map(Some)
    }
}

/// One connector of the env bundle (2.3). `Debug` prints the value as
/// `[REDACTED]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Connector {
    /// The variable name.
    pub env_var: String,
    /// The value (secret).
    #[serde(serialize_with = "crate::secret::serialize_exposed")]
    pub value: Secret,
    /// Who gets the value (2.3, an extension of ours): absent or `agent`,
    /// the agent (today's behaviour); `setup`, the setup script only. Kept
    /// as text so that an unknown scope is refused naming the variable
    /// (`reserved_connector_env`), not as a parse error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// 2.3 response.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvBundle {
    /// Variables to set in the agent's environment.
    #[serde(default)]
    pub connectors: Vec<Connector>,
    /// Names of variables whose values are secret too.
    #[serde(default)]
    pub redact_vars: Vec<String>,
}

/// 2.4 response envelope: `{"session": {…}}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SessionEnvelope {
    /// The session.
    pub session: Session,
}

/// The session (2.4).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Session {
    /// Required.
    pub workspace_id: String,
    /// The session branch (git-value checked by the runner).
    pub repo_branch: String,
    /// `active` while the session lives.
    #[serde(default)]
    pub status: Option<String>,
    /// Task, model, effort, surface, time cap.
    pub client_info: ClientInfo,
    /// Newest first.
    #[serde(default)]
    pub runs: Vec<RunRef>,
    /// Kept raw so that a malformed turn is its own error
    /// (`hosted_pending_turn_invalid`), see [`Session::pending_turn`].
    #[serde(default)]
    pub pending_turn: Option<Value>,
    /// The run the user asked to interrupt.
    #[serde(default)]
    pub interrupt_requested_run_id: Option<String>,
    /// The agent's own session id, for resume.
    #[serde(default)]
    pub agent_session_id: Option<String>,
    /// Project id, passed through.
    #[serde(default)]
    pub project_id: Option<String>,
    /// The repository's setup (2.4, an extension of ours): absent, the
    /// image's `--setup-script` and `--setup-inputs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<SessionSetup>,
    /// An extension (2.4): the egress canary, `HOST:PORT` or `https://HOST`,
    /// checked before the first agent starts (4.1 step 3); it wins over
    /// `--egress-canary`. Absent or null: the runner's own setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_canary: Option<String>,
    /// An extension (2.4): the platform's instructions for the agent, given
    /// to each CLI through its own per-invocation mechanism (section 3,
    /// "The platform's instructions"); they win over
    /// `--instructions-file`. Absent or null: the runner's own setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// An extension (2.4, 2.7): the coordinator keeps the agent CLI's own
    /// session state and says how large a saved state may be. Absent or
    /// null: the runner neither saves nor restores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_state: Option<AgentStateOffer>,
    /// An extension (2.2, 2.4): the coordinator takes the `released` boot
    /// status (an idle or retired sandbox gives the session back). Absent
    /// or false: the runner never releases a session.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub accepts_released: bool,
}

/// `session.agentState` (2.4, an optional extension): the agent-state
/// route (2.7) is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentStateOffer {
    /// The largest save request body the coordinator takes, bytes; a
    /// larger state is not sent.
    pub max_bytes: u64,
}

/// The version of [`AgentState`]'s layout this runner writes and reads.
pub const AGENT_STATE_FORMAT: u32 = 1;

/// The agent CLI's own session state for one agent session (2.7): saved by
/// the runner after a turn, given back to the next sandbox's runner. The
/// coordinator stores it as it came; only the runner reads `files`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentState {
    /// [`AGENT_STATE_FORMAT`].
    pub format: u32,
    /// The CLI whose state it is: `claude`, `codex` or `opencode` (both
    /// adapters of a CLI share its state).
    pub cli: String,
    /// The agent session the state holds (`finish.agentSessionId`).
    pub agent_session_id: String,
    /// The run after which it was saved.
    pub run_id: String,
    /// The files, by path relative to the CLI's own directory for the
    /// session (PROTOCOL.md 2.7 names it per CLI).
    pub files: Vec<AgentStateFile>,
}

/// One file of an [`AgentState`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentStateFile {
    /// Relative, `/`-separated, no `.` or `..` component.
    pub path: String,
    /// The bytes, base64 (RFC 4648, with padding), secrets redacted.
    pub content: String,
}

/// The load answer (2.7): the state last saved for the session, or null.
/// Kept raw so that a state of the wrong shape is refused on its own (an
/// event, the turn runs as without one), not as an unusable answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentStateAnswer {
    /// The saved [`AgentState`], as the coordinator stored it.
    #[serde(default)]
    pub agent_state: Option<Value>,
}

/// `session.setup` (2.4, an extension of ours; PROTOCOL.md 4.1 "Setup").
/// Each field, when present, wins over the image's flag.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionSetup {
    /// A shell command (`sh -c`) run in `repo/` before the first agent;
    /// absent: `--setup-script`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    /// Globs of the files under `repo/` setup depends on (its cache's
    /// fingerprint); absent: `--setup-inputs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Vec<String>>,
}

/// Why a session's `pendingTurn` is not a turn.
#[derive(Debug, thiserror::Error)]
pub enum PendingTurnShape {
    /// Neither an object nor null (the JSON kind it is).
    #[error("pendingTurn has the wrong shape: expected an object or null, got {0}")]
    NotAnObject(&'static str),
    /// An object whose fields do not make a turn: the member and the kind
    /// of value found, never its text (the turn's prompt is the user's).
    #[error("pendingTurn has the wrong shape: {0}")]
    Fields(String),
}

impl Session {
    /// Whether the session is still `active` (an absent status counts as
    /// active, as in the Node boot).
    pub fn is_active(&self) -> bool {
        self.status.as_deref().is_none_or(|s| s == "active")
    }

    /// The pending turn, or `Err` with why its shape is wrong.
    pub fn pending_turn(&self) -> Result<Option<PendingTurn>, PendingTurnShape> {
        match &self.pending_turn {
            None | Some(Value::Null) => Ok(None),
            // serde's derive would take an array as the fields in order.
            Some(v) if !v.is_object() => Err(PendingTurnShape::NotAnObject(json_kind(v))),
            Some(v) => decode::from_value::<PendingTurn>(v.clone())
                .map(Some)
                .map_err(PendingTurnShape::Fields),
        }
    }

    /// The status of run `run_id` in `runs`, if listed.
    pub fn run_status(&self, run_id: &str) -> Option<&str> {
        self.runs
            .iter()
            .find(|r| r.id == run_id)
            .map(|r| r.status.as_str())
    }
}

/// `clientInfo` (2.4).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientInfo {
    /// The initial task prompt.
    pub task: String,
    /// Passed to the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Passed to the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
    /// Passed to the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub surface: Option<String>,
    /// Per-turn time cap in minutes (the supervisor issue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_minutes: Option<f64>,
}

/// An entry of `runs` (2.4).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRef {
    /// The run id.
    pub id: String,
    /// `pending`, `running`, `succeeded`, `failed`, `interrupted`, …
    pub status: String,
}

/// `pendingTurn` (2.4). Members it does not name are ignored (2,
/// "2xx answers the runner cannot use"): a newer coordinator may add a
/// trace context or a priority, and refusing them would wedge every runner.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingTurn {
    /// May be null, but not absent.
    #[serde(deserialize_with = "nullable")]
    pub turn_id: Option<String>,
    /// At least 1.
    pub ordinal: u64,
    /// The run this turn seals.
    pub run_id: String,
    /// The user's message.
    pub body: String,
    /// The client's id of that message.
    pub client_message_id: String,
    /// Set when the turn answers a question the agent asked (4.3); null
    /// otherwise, never absent (a misspelt member, ignored as unknown,
    /// would otherwise turn an answer into a plain message).
    #[serde(deserialize_with = "nullable")]
    pub answer_to_question: Option<AnswerToQuestion>,
    /// Optional extension (issue 40): the W3C trace context of the turn
    /// on the coordinator's side, which the runner's span of the turn
    /// continues. Anything but a string reads as absent: trace context is
    /// never a reason to refuse a turn.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "string_or_none"
    )]
    pub traceparent: Option<String>,
    /// Optional extension: the `tracestate` beside [`PendingTurn::traceparent`].
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "string_or_none"
    )]
    pub tracestate: Option<String>,
}

/// A string member, or `None` for anything else (an optional extension
/// whose value is not understood is ignored, as an unknown member is).
fn string_or_none<'de, D>(d: D) -> Result<Option<String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Ok(match Value::deserialize(d)? {
        Value::String(s) => Some(s),
        _ => None,
    })
}

/// A member that must be present and may be null: with a `deserialize_with`
/// serde reports a missing member, where a plain `Option` would read it as
/// null.
fn nullable<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d)
}

/// The JSON type of `v`, for error messages.
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `answerToQuestion` (2.4).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AnswerToQuestion {
    /// The question's id.
    pub question_id: String,
    /// The question's text.
    pub question: String,
}

/// 2.5 request access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// Clone and fetch.
    Read,
    /// Push.
    Write,
}

/// 2.5 request body.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RepoTokenRequest {
    /// `read` or `write`.
    pub access: Access,
}

/// 2.5 response. `Debug` prints the token as `[REDACTED]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RepoTokenResponse {
    /// The repo token (secret).
    #[serde(serialize_with = "crate::secret::serialize_exposed")]
    pub token: Secret,
    /// Expiry (absent or null: not cached by the credential helper).
    #[serde(default)]
    pub expires_at: Option<ExpiresAt>,
    /// `owner/name` on the git base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo_full_name: Option<String>,
    /// A Cloudflare artifacts remote (checked shape).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifacts_remote: Option<String>,
}

/// One run event (2.6).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// From 1 per run, no gaps.
    pub seq: u64,
    /// Event type.
    #[serde(rename = "type")]
    pub kind: String,
    /// RFC 3339.
    pub at: String,
    /// Payload.
    pub data: Value,
}

/// 2.6 events request body.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EventsBody {
    /// In `seq` order.
    pub events: Vec<Event>,
}

/// 2.6 events and cursor response.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AcceptedThrough {
    /// Highest `seq` the coordinator holds.
    pub accepted_through: u64,
}

/// Terminal status of a run (2.6 `finish.status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    /// The agent exited 0.
    Succeeded,
    /// The turn failed (fatal for the boot).
    Failed,
    /// Stopped by an interrupt request or a stop signal.
    Interrupted,
}

impl RunOutcome {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            RunOutcome::Succeeded => "succeeded",
            RunOutcome::Failed => "failed",
            RunOutcome::Interrupted => "interrupted",
        }
    }
}

/// Writes [`ErrorCode`], its wire names ([`ErrorCode::as_str`]) and
/// [`ErrorCode::ALL`] from one list, so that a code added here is in `ALL`
/// (and so in the OpenAPI document's check, `tests/suite/openapi.rs`) too.
macro_rules! error_codes {
    ($( $(#[doc = $doc:literal])* $variant:ident => $wire:literal, )*) => {
        /// `finish.error.code` (2.6), and the code a `failed` reason starts with
        /// (2.2). Frozen: the inside may change, these may not.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum ErrorCode {
            $( $(#[doc = $doc])* $variant, )*
        }

        impl ErrorCode {
            /// Every code, in declaration order.
            pub const ALL: &[ErrorCode] = &[$(ErrorCode::$variant),*];

            /// The code as it is on the wire (`provider_rate_limited`, …).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $wire,)*
                }
            }
        }
    };
}

error_codes! {
    /// Provider quota exhausted.
    ProviderQuotaExhausted => "provider_quota_exhausted",
    /// Provider rate limit (the only retryable code).
    ProviderRateLimited => "provider_rate_limited",
    /// A 429 with no evidence of either.
    ProviderLimitUnknown => "provider_limit_unknown",
    /// Provider overloaded.
    ProviderOverloaded => "provider_overloaded",
    /// Provider 5xx.
    ProviderServerError => "provider_server_error",
    /// Provider authentication.
    ProviderAuth => "provider_auth",
    /// Context window exceeded.
    ContextWindowExceeded => "context_window_exceeded",
    /// Invalid request.
    InvalidRequest => "invalid_request",
    /// Agent session resume failed.
    ResumeFailed => "resume_failed",
    /// Watchdog: no output.
    AgentHung => "agent_hung",
    /// Per-turn time cap reached.
    AgentTimeout => "agent_timeout",
    /// The agent exited non-zero.
    AgentCrashed => "agent_crashed",
    /// The agent could not be started.
    AgentSpawnFailed => "agent_spawn_failed",
    /// Events could not be delivered.
    EventsUndelivered => "events_undelivered",
    /// The runner itself failed the turn.
    RunnerError => "runner_error",
    /// The setup script failed or outlived `--setup-timeout` (4.1 step 3,
    /// "Setup"): the first turn fails, not retryable.
    SetupFailed => "setup_failed",
    /// The egress canary was reachable before the first agent started: the
    /// sandbox's egress policy is not enforced, no agent ran (4.1 step 3,
    /// "The egress canary").
    EgressPolicyMissing => "egress_policy_missing",
    /// The session answer is over its size cap (2, 2.2): only ever the code
    /// of a `failed` boot-status reason, since the run it carries was never
    /// read and so is never sealed.
    SessionTooLarge => "session_too_large",
    // The codes below start a `failed` reason (2.2) and are never in a
    // `finish`: they end a boot before its first turn.
    /// The env bundle sets a reserved or invalid name (2.3).
    ReservedConnectorEnv => "reserved_connector_env",
    /// `pendingTurn` breaks its shape at boot (2.4).
    HostedPendingTurnInvalid => "hosted_pending_turn_invalid",
    /// The session branch does not exist on the remote (3, 4 step 5).
    SessionBranchMissing => "session_branch_missing",
    /// `repo/` exists but is not a clone of the session's remote (3).
    RepoConflict => "repo_conflict",
    /// The clone failed: refused, or every attempt of the clone row failed
    /// (2, 4 step 5).
    CloneFailed => "clone_failed",
    /// A file under the root (session directory, `repo/`) could not be
    /// read or written (3).
    WorkspaceIo => "workspace_io",
    /// A value the coordinator sent failed its check (5).
    InvalidValue => "invalid_value",
}

impl ErrorCode {
    /// `finish.error.retryable` for this code (2.6): only
    /// `provider_rate_limited` is.
    pub const fn retryable(self) -> bool {
        matches!(self, ErrorCode::ProviderRateLimited)
    }

    /// `<code>: <message>`: how a `failed` reason (2.2) starts with the
    /// code of its failure, for a coordinator to match on.
    pub fn reason(self, message: impl std::fmt::Display) -> String {
        format!("{}: {message}", self.as_str())
    }
}

/// `finish.error` (2.6).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FinishError {
    /// The code.
    pub code: ErrorCode,
    /// Redacted, at most 800 characters.
    pub message: String,
    /// Whether the coordinator may retry.
    pub retryable: bool,
    /// Suggested wait, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// When a limit resets (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resets_at: Option<String>,
}

/// 2.6 finish request body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FinishBody {
    /// Terminal status.
    pub status: RunOutcome,
    /// The agent's session id, for resume.
    pub agent_session_id: Option<String>,
    /// Why it failed.
    pub error: Option<FinishError>,
    /// Token usage, when the agent reported any.
    pub usage: Option<Usage>,
    /// The harvest of the turn's work (4.5); null only when the run is
    /// sealed by a fatal path on which no harvest ran.
    pub result: Option<HarvestResult>,
    /// The agent CLI had no state for the session it was asked to resume,
    /// and the turn ran in a fresh agent session (2.6, optional: absent
    /// otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_session_reset: Option<AgentSessionReset>,
    /// What the agent's processes used in the turn (2.6, optional: absent
    /// when not measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
}

/// `finish.resources` (2.6): what the turn's agent processes used.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    /// CPU time, user and system, in seconds.
    pub cpu_seconds: f64,
    /// The peak resident memory, bytes: of the turn's cgroup as a whole
    /// (`cgroup`), or of the largest single process (`rusage`).
    pub peak_rss_bytes: u64,
    /// Where the figures come from.
    pub source: ResourceSource,
}

/// `finish.resources.source` (2.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResourceSource {
    /// The turn's cgroup: every process of the turn.
    Cgroup,
    /// The agent's `rusage`: its leader and the descendants waited for.
    Rusage,
}

/// `finish.agentSessionReset` (2.6) and the `hosted_boot.agent_session_reset`
/// event's data: the resume the CLI refused, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentSessionReset {
    /// The agent session id the turn was to resume.
    pub requested: String,
    /// What the CLI said (redacted, at most 800 characters).
    pub reason: String,
}

/// `finish.usage` (PROTOCOL.md 2.6): the turn's token usage, `{"model",
/// "inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens",
/// "costUsd"}`, each member present only when the agent's CLI reported it
/// (`None`: absent on the wire). Summed over the turn (its continuations
/// included), never cumulative across turns; the adapters sum it
/// (`agent::usage`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// The model that served the turn (the last one the agent named).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Input tokens neither read from nor written to the cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    /// Output tokens, reasoning included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    /// Input tokens read from the cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_tokens: Option<u64>,
    /// Input tokens written to the cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_tokens: Option<u64>,
    /// Cost in US dollars, the CLI's own estimate; sent rounded to 9
    /// decimals.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "rounded_cost"
    )]
    pub cost_usd: Option<f64>,
}

impl Usage {
    /// Whether nothing was reported (the finish then sends `usage: null`).
    pub fn is_empty(&self) -> bool {
        *self == Usage::default()
    }
}

// Sums of binary fractions (0.1 + 0.2): send what a person would write.
fn rounded_cost<S: serde::Serializer>(cost: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match cost {
        Some(c) => s.serialize_some(&((c * 1e9).round() / 1e9)),
        None => s.serialize_none(),
    }
}

/// `finish.result` and the `hosted_boot.harvest` event's data (PROTOCOL.md
/// 4.5): where the agent's work went. The default is the report before
/// anything was done: nothing pushed, nothing counted, no name or branch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HarvestResult {
    /// The run id, or `recovered-at-boot` for the harvest of a reused `repo/`.
    pub name: String,
    /// The session branch (the push target unless `recoveryBranch` is set).
    pub branch: String,
    /// The commit harvested (`HEAD` after the harvest's own commit, 40 hex);
    /// null only when `repo/` could not be read.
    pub head_sha: Option<String>,
    /// Whether `headSha` is on the remote after the harvest (on the session
    /// branch, or on `recoveryBranch`). False only with `pushError`.
    pub pushed: bool,
    /// Commits from where the turn started to `headSha`.
    pub commits: u64,
    /// Files changed from the turn's start (its merge base with `headSha`)
    /// to `headSha`.
    pub files_changed: u64,
    /// Lines added, same range.
    pub insertions: u64,
    /// Lines removed, same range.
    pub deletions: u64,
    /// The commit the harvest made of what the agent left uncommitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harvest_commit: Option<String>,
    /// `<branch>-recovered-<runId>` (or `<branch>-recovered-at-boot`) when the
    /// session branch had moved on and the work was pushed there instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_branch: Option<String>,
    /// Why the work is not (or not known to be) on the remote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push_error: Option<PushError>,
    /// Files over the size limit (`--harvest-max-file-size`) left out of
    /// what was committed and pushed, by path; they stay in the work tree
    /// (uncommitted) when they are still there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped_files: Vec<SkippedFile>,
    /// When commits of the agent held such files: the local ref in `repo/`
    /// (`refs/hosted-boot/oversized/<name>`) that keeps those commits;
    /// `headSha` is then one commit of the same work without the files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oversized_ref: Option<String>,
    /// Where the local session branch's own commits went before it was
    /// moved, when no remote branch nor `headSha` held them (the agent
    /// committed on it, then moved `HEAD` away):
    /// `<branch>-recovered-<runId>-branch` (PROTOCOL.md 4.5 step 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_branch_recovery: Option<String>,
    /// The local ref that keeps the commits a force push dropped from the
    /// session branch while the runner was down (the harvest at boot,
    /// PROTOCOL.md 4.5); they are not pushed back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discarded_ref: Option<String>,
    /// Paths held back because what the agent committed there (in any
    /// commit of the push, a file deleted again included) holds a secret
    /// the runner knows (PROTOCOL.md 4.5, "Secrets in the agent's work");
    /// never the value (a path that spells one is redacted). They stay in
    /// the work tree, uncommitted, and are named again by every harvest that
    /// holds them back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked_paths: Vec<String>,
    /// When the agent's commits were held back: the local ref in `repo/`
    /// that keeps them (`refs/hosted-boot/blocked/<name>`), never pushed;
    /// `headSha` is then one commit of the same work without those paths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_ref: Option<String>,
    /// Gitlinks the agent committed itself, in the commits of this push,
    /// whose commit others cannot fetch (PROTOCOL.md 4.5, "Submodules and
    /// LFS files", issue 33). They are part of `headSha` as the agent
    /// committed them: on the remote when `pushed` is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unpublished_gitlinks: Vec<UnpublishedGitlink>,
}

/// `finish.result.unpublishedGitlinks[]` (4.5): a gitlink of the pushed
/// commits whose commit is not known to be anywhere others can fetch it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnpublishedGitlink {
    /// Its path in the repository.
    pub path: String,
    /// The commit it records (40 hex digits).
    pub commit: String,
    /// Why others cannot fetch it.
    pub reason: GitlinkReason,
}

/// `finish.result.unpublishedGitlinks[].reason` (4.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GitlinkReason {
    /// The submodule's repository in the sandbox has the commit, and none
    /// of its remote-tracking branches contains it: the agent did not push
    /// it (what `git push --recurse-submodules=check` refuses).
    SubmoduleNotPushed,
    /// No entry of the commit's `.gitmodules` gives the path (an embedded
    /// repository committed with `git add`): nobody else can check it out.
    NoGitmodulesEntry,
}

/// `finish.result.skippedFiles[]` (4.5): a file left out of the harvest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SkippedFile {
    /// The path in the repository.
    pub path: String,
    /// Its size in bytes (0 for a nested repository, a directory).
    pub bytes: u64,
    /// Why it was left out; absent: it is over the size limit (the only
    /// reason before issue 33, so a coordinator that reads none sees what
    /// it saw).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<SkipReason>,
}

/// `finish.result.skippedFiles[].reason` (4.5, issue 33).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// Its attributes name a filter other than LFS's, which the harvest
    /// does not run: committed, the plaintext would be pushed where `git
    /// add` would store the filter's output.
    CleanFilter,
    /// A directory holding its own `.git` (a repository of its own, not a
    /// submodule): its files are not the superproject's to commit.
    NestedRepository,
    /// A new or changed LFS-tracked file: the harvest commits no pointer
    /// for it (libgit2 runs no filter) and uploads no LFS object.
    Lfs,
}

/// `finish.result.pushError` (4.5). A failed push does not fail the turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PushError {
    /// What kind of failure.
    pub code: PushErrorCode,
    /// What happened (redacted, at most 800 characters).
    pub message: String,
}

/// `finish.result.pushError.code` (4.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PushErrorCode {
    /// git or the server refused (a ref update rejected, credentials
    /// refused, no such repository): a verdict, not retried.
    PushRejected,
    /// The transport failed on every attempt (section 2: 3 attempts).
    PushFailed,
    /// The harvest's time bound ran out.
    HarvestTimeout,
    /// `repo/` could not be read or committed to.
    HarvestFailed,
}

impl PushErrorCode {
    /// The wire name (`push_rejected`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            PushErrorCode::PushRejected => "push_rejected",
            PushErrorCode::PushFailed => "push_failed",
            PushErrorCode::HarvestTimeout => "harvest_timeout",
            PushErrorCode::HarvestFailed => "harvest_failed",
        }
    }
}

/// The `hosted_boot.workspace_sync` event's data (PROTOCOL.md 4.1 step 3,
/// 4.5 "Before a turn"): where the turn's workspace was brought before the
/// agent started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceSync {
    /// The session branch.
    pub branch: String,
    /// What was done.
    pub outcome: SyncOutcome,
    /// `HEAD` of `repo/` before the sync (40 hex); null when `repo/` could
    /// not be read.
    pub local_sha: Option<String>,
    /// The remote session branch's tip; null when the fetch failed or the
    /// branch is missing on the remote.
    pub remote_sha: Option<String>,
    /// The commit the agent starts on (`HEAD` after the sync).
    pub start_sha: Option<String>,
    /// Where local work that was on no remote branch was pushed
    /// (`<branch>-recovered-before-<runId>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_branch: Option<String>,
    /// The local ref (`refs/hosted-boot/discarded/<runId>`) that keeps
    /// commits the remote session branch no longer has (a force push).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discarded_ref: Option<String>,
    /// Those commits, newest first, at most [`MAX_LISTED_COMMITS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub discarded_commits: Vec<String>,
    /// How many commits were discarded (the list may be shorter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discarded_count: Option<u64>,
    /// Where the local session branch's own commits went before the sync
    /// moved it, when no remote branch nor `HEAD` held them:
    /// `<branch>-recovered-before-<runId>-branch` (PROTOCOL.md 4.5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_branch_recovery: Option<String>,
    /// Paths of the local work held back before its push because they hold
    /// a secret (PROTOCOL.md 4.5, "Secrets in the agent's work"), as in
    /// `finish.result.blockedPaths`; never the value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked_paths: Vec<String>,
    /// The local ref that keeps the held-back commits
    /// (`refs/hosted-boot/blocked/before-<runId>`), never pushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_ref: Option<String>,
    /// Why the workspace was not moved (`outcome` `kept_local`), or what
    /// went wrong on the way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<SyncWarning>,
}

/// The report before anything was done: `kept_local` (the workspace was
/// not moved), nothing known, no branch, no warning.
impl Default for WorkspaceSync {
    fn default() -> Self {
        WorkspaceSync {
            branch: String::new(),
            outcome: SyncOutcome::KeptLocal,
            local_sha: None,
            remote_sha: None,
            start_sha: None,
            recovery_branch: None,
            discarded_ref: None,
            discarded_commits: Vec::new(),
            discarded_count: None,
            local_branch_recovery: None,
            blocked_paths: Vec::new(),
            blocked_ref: None,
            warning: None,
        }
    }
}

/// Most commits a report lists by id (the count is given whole).
pub const MAX_LISTED_COMMITS: usize = 100;

/// `hosted_boot.workspace_sync.outcome` (PROTOCOL.md 4.5 "Before a turn").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncOutcome {
    /// `HEAD` was the remote's tip already.
    UpToDate,
    /// The remote's tip contained `HEAD` (someone pushed on top): moved to it.
    FastForward,
    /// `HEAD` held commits the remote lacked and was a fast-forward of it:
    /// pushed to the session branch; the turn starts there.
    Pushed,
    /// Moved to the remote's tip after local work went to a recovery branch
    /// and/or commits the remote dropped were kept on a local ref.
    Reset,
    /// Not moved (`warning` says why): the turn starts from the local
    /// `HEAD` and its harvest reconciles.
    KeptLocal,
}

/// `hosted_boot.workspace_sync.warning`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SyncWarning {
    /// What kind of problem.
    pub code: SyncWarningCode,
    /// What happened (redacted, at most 800 characters).
    pub message: String,
}

/// `hosted_boot.workspace_sync.warning.code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncWarningCode {
    /// The session branch could not be fetched (transport failures on every
    /// attempt, or refused).
    FetchFailed,
    /// The remote has no session branch.
    BranchMissing,
    /// Local work could not be pushed (to the session branch or a recovery
    /// branch), so the workspace was not moved.
    PushFailed,
    /// The remote's tip could not be checked out (it would overwrite a file
    /// left uncommitted in the work tree).
    CheckoutFailed,
    /// `repo/` could not be read.
    RepoUnreadable,
    /// The sync's time bound ran out.
    SyncTimeout,
}

/// Most characters in a `reason` or `finish.error.message` (2.2, 2.6).
pub const MAX_REASON_CHARS: usize = 800;

/// Truncates `text` to [`MAX_REASON_CHARS`] characters (call after redaction).
pub fn truncate_reason(text: &str) -> String {
    crate::text::head(text, MAX_REASON_CHARS).to_string()
}

/// The wire name of a field value (`push_rejected`, `kept_local`): what
/// serde writes for a unit variant, for log lines a person reads (Rust's
/// debug text, `PushRejected`, is not a name they can look up).
pub fn wire_name<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `as_str` is the serde name of every code, and only
    /// `provider_rate_limited` is retryable (2.6's closed list).
    #[test]
    fn error_codes_spell_as_on_the_wire() {
        for &code in ErrorCode::ALL {
            assert_eq!(serde_json::to_value(code).unwrap(), json!(code.as_str()));
            assert_eq!(code.retryable(), code == ErrorCode::ProviderRateLimited);
        }
    }

    #[test]
    fn push_error_codes_spell_as_on_the_wire() {
        use PushErrorCode as C;
        for code in [
            C::PushRejected,
            C::PushFailed,
            C::HarvestTimeout,
            C::HarvestFailed,
        ] {
            assert_eq!(serde_json::to_value(code).unwrap(), json!(code.as_str()));
        }
    }

    #[test]
    fn boot_status_bodies_match_the_contract() {
        let ready = BootStatusBody {
            status: BootStatus::Ready,
            run_id: None,
            reason: None,
        };
        assert_eq!(
            serde_json::to_value(&ready).unwrap(),
            json!({"status": "ready"})
        );
        let failed = BootStatusBody {
            status: BootStatus::Failed,
            run_id: Some(None),
            reason: Some("boom".into()),
        };
        assert_eq!(
            serde_json::to_value(&failed).unwrap(),
            json!({"status": "failed", "runId": null, "reason": "boom"})
        );
        let started = BootStatusBody {
            status: BootStatus::TurnStarted,
            run_id: Some(Some("run-1".into())),
            reason: None,
        };
        assert_eq!(
            serde_json::to_value(&started).unwrap(),
            json!({"status": "turn_started", "runId": "run-1"})
        );
    }

    /// `finish.usage` (2.6): camelCase members, each only when reported,
    /// the cost rounded to 9 decimals; an empty usage is still `{}` (the
    /// finish sends null instead, see `agent::usage`).
    #[test]
    fn usage_is_the_contracts_shape() {
        let u = Usage {
            model: Some("m".into()),
            input_tokens: Some(1),
            output_tokens: Some(2),
            cache_read_tokens: Some(3),
            cache_write_tokens: Some(4),
            cost_usd: Some(0.1 + 0.2),
        };
        let wire = json!({"model": "m", "inputTokens": 1, "outputTokens": 2,
            "cacheReadTokens": 3, "cacheWriteTokens": 4, "costUsd": 0.3});
        assert_eq!(serde_json::to_value(&u).unwrap(), wire);
        let back: Usage = serde_json::from_value(wire).unwrap();
        assert_eq!(back.cost_usd, Some(0.3));
        let some = Usage {
            output_tokens: Some(7),
            ..Usage::default()
        };
        assert_eq!(
            serde_json::to_value(&some).unwrap(),
            json!({"outputTokens": 7})
        );
        assert!(Usage::default().is_empty() && !some.is_empty());
        assert_eq!(serde_json::to_value(Usage::default()).unwrap(), json!({}));
    }

    #[test]
    fn expires_at_accepts_both_forms() {
        let a: AgentTokenResponse =
            serde_json::from_value(json!({"token": "t", "expiresAt": "1970-01-01T00:00:01Z"}))
                .unwrap();
        assert_eq!(a.expires_at.unwrap().epoch_ms(), Some(1000.0));
        let b: AgentTokenResponse =
            serde_json::from_value(json!({"token": "t", "expiresAt": 2000})).unwrap();
        assert_eq!(b.expires_at.unwrap().epoch_ms(), Some(2000.0));
        let c: AgentTokenResponse =
            serde_json::from_value(json!({"token": "t", "expiresAt": null})).unwrap();
        assert!(c.expires_at.is_none());
    }

    #[test]
    fn debug_never_prints_a_token_or_connector_value() {
        let a: AgentTokenResponse =
            serde_json::from_value(json!({"token": "bearer-value-1", "expiresAt": 1})).unwrap();
        let r: RepoTokenResponse =
            serde_json::from_value(json!({"token": "repo-token-value-2", "repoFullName": "o/r"}))
                .unwrap();
        let b: EnvBundle = serde_json::from_value(json!({
            "connectors": [{"envVar": "ACME_KEY", "value": "connector-value-3"}],
            "redactVars": []
        }))
        .unwrap();
        let shown = format!("{a:?} {a:#?} {r:?} {r:#?} {b:?} {b:#?}");
        for value in ["bearer-value-1", "repo-token-value-2", "connector-value-3"] {
            assert!(!shown.contains(value), "{shown}");
        }
        assert!(shown.contains("ACME_KEY") && shown.contains("[REDACTED]"));
        // The wire still carries the values.
        assert_eq!(
            serde_json::to_value(&r).unwrap()["token"],
            "repo-token-value-2"
        );
        assert_eq!(
            serde_json::to_value(&b).unwrap()["connectors"][0]["value"],
            "connector-value-3"
        );
        assert_eq!(serde_json::to_value(&a).unwrap()["token"], "bearer-value-1");
    }

    #[test]
    fn pending_turn_shape_is_checked() {
        let mut s: Session = serde_json::from_value(json!({"session": {
            "workspaceId": "w", "repoBranch": "b", "clientInfo": {"task": "t"},
            "pendingTurn": {"turnId": null, "ordinal": 1, "runId": "r", "body": "x",
                "clientMessageId": "c", "answerToQuestion": null}
        }}))
        .map(|e: SessionEnvelope| e.session)
        .unwrap();
        assert_eq!(s.pending_turn().unwrap().unwrap().run_id, "r");
        s.pending_turn = Some(json!({"runId": 3}));
        assert!(s.pending_turn().is_err());
        let valid = json!({"turnId": null, "ordinal": 1, "runId": "r", "body": "x",
            "clientMessageId": "c", "answerToQuestion": null});
        // Members it does not name are ignored (issue 30).
        let mut extra = valid.clone();
        extra["traceparent"] = json!("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        s.pending_turn = Some(extra);
        assert_eq!(s.pending_turn().unwrap().unwrap().run_id, "r");
        // The nullable members are required: a misspelt answerToQuestion
        // is not read as a plain message.
        for member in ["turnId", "answerToQuestion"] {
            let mut missing = valid.clone();
            let value = missing.as_object_mut().unwrap().remove(member).unwrap();
            missing["answer_to_question"] = value;
            s.pending_turn = Some(missing);
            let e = s.pending_turn().unwrap_err().to_string();
            assert!(e.contains(&format!("missing field `{member}`")), "{e}");
        }
        // Not an object: not the fields in order.
        s.pending_turn = Some(json!([null, 1, "r", "x", "c", null]));
        let e = s.pending_turn().unwrap_err().to_string();
        assert!(
            e.contains("expected an object or null, got an array"),
            "{e}"
        );
        s.pending_turn = Some(
            json!({"turnId": null, "ordinal": "1", "runId": "r", "body": "x",
            "clientMessageId": "c", "answerToQuestion": null}),
        );
        assert!(
            s.pending_turn().is_err(),
            "a known member of the wrong type"
        );
    }
}
