//! The coordinator's in-memory session (PROTOCOL.md section 6, "State") and
//! the plain records it exposes: runs, faults, the request record.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime};

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::wire::routes::Route;
use crate::wire::{
    Access, AnswerToQuestion, BootStatusBody, ClientInfo, Event, FinishBody, PendingTurn, RunRef,
    Session,
};

/// What a request was addressed to, by the shape of its path: a route of
/// the table ([`crate::wire::routes`], PROTOCOL.md section 2), `git`,
/// `dev` or none. Serialized by name, as `POST dev/faults` and
/// `GET dev/requests` name it in their `route` member (PROTOCOL.md section
/// 6): the table's name for its routes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// A route of the table (section 2).
    Route(Route),
    /// Anything under `git/` (smart HTTP).
    Git,
    /// Anything under `dev/` (the dev API; no faults).
    Dev,
    /// A path that matches no route (answered `404`; no faults).
    Unknown,
}

impl From<Route> for Target {
    fn from(route: Route) -> Target {
        Target::Route(route)
    }
}

/// `recorded.route == Route::Session`, as tests and the demo ask.
impl PartialEq<Route> for Target {
    fn eq(&self, route: &Route) -> bool {
        *self == Target::Route(*route)
    }
}

impl Target {
    /// The route of the table, for the routes of PROTOCOL.md section 2.
    pub fn api(self) -> Option<Route> {
        match self {
            Target::Route(route) => Some(route),
            Target::Git | Target::Dev | Target::Unknown => None,
        }
    }

    /// The wire name (`agent-token`, `run-started`, …, `git`, `dev`,
    /// `unknown`).
    pub fn name(self) -> &'static str {
        match self {
            Target::Route(route) => route.name(),
            Target::Git => "git",
            Target::Dev => "dev",
            Target::Unknown => "unknown",
        }
    }

    /// The target named `name`, if any.
    pub fn from_name(name: &str) -> Option<Target> {
        match name {
            "git" => Some(Target::Git),
            "dev" => Some(Target::Dev),
            "unknown" => Some(Target::Unknown),
            _ => Route::from_name(name).map(Target::Route),
        }
    }
}

impl Serialize for Target {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Target {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Target, D::Error> {
        let name = String::deserialize(d)?;
        Target::from_name(&name).ok_or_else(|| {
            let known: Vec<&str> = Route::all()
                .map(Route::name)
                .chain(["git", "dev", "unknown"])
                .collect();
            // Quoted in backticks, as serde quotes a name: a message that
            // quotes in double quotes is cut there (wire::decode).
            serde::de::Error::custom(format!(
                "unknown route `{}`: one of {}",
                crate::text::clip(&name, 40),
                known.join(", ")
            ))
        })
    }
}

fn one() -> u32 {
    1
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// An injected fault (`POST dev/faults`, PROTOCOL.md section 6): the next
/// `count` requests to `route` get it.
///
/// - `reset`: the connection is dropped without any HTTP response (the client
///   sees a transport error);
/// - `status` and/or `body`: that answer replaces the normal one (`status`
///   defaults to 200 when only `body` is given, `body` to
///   `{"error":"injected fault"}`); `retryAfter` adds a `Retry-After` header;
/// - `delayMs`: a wait before the answer; alone, the normal answer follows.
/// - `after`: the request is first handled normally (its effects happen, e.g. a
///   `finish` is recorded), then its answer is replaced or dropped: a lost
///   response. Not for `git`.
/// - `padBytes`: the answer's body is followed by this many spaces (JSON
///   allows trailing whitespace, so it still parses), with a `Content-Length`
///   that counts them when the answer had one: a body over a size cap
///   without holding it in memory. Not for `git`.
/// - `stallMs`: the answer's headers and the first half of its first body
///   chunk (at least one byte) are sent, then the body pauses this long
///   before the rest (and its end): a transfer that stops making progress,
///   even for a client that reads only as far as it needs.
///
/// Faults for the same route queue up in the order they were added.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Fault {
    /// The route; `dev` and `unknown` are refused.
    pub route: Target,
    /// HTTP status of the replacing answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Drop the connection without a response.
    #[serde(default, skip_serializing_if = "is_false")]
    pub reset: bool,
    /// Wait this many milliseconds before answering (or dropping).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// Body of the replacing answer (sent as `application/json`, verbatim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// Value of a `Retry-After` header on the replacing answer (seconds or an
    /// HTTP date, verbatim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<String>,
    /// Value of a `Location` header on the replacing answer (verbatim; with
    /// a `3xx` status, a redirect).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// Handle the request normally first, then replace or drop the answer.
    #[serde(default, skip_serializing_if = "is_false")]
    pub after: bool,
    /// Spaces appended to the answer's body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_bytes: Option<u64>,
    /// Pause, in milliseconds, after the first half of the first chunk of
    /// the answer's body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_ms: Option<u64>,
    /// How many requests get the fault (at least 1; default 1).
    #[serde(default = "one")]
    pub count: u32,
    /// Send the answer's status, headers (its `Content-Length` whole) and
    /// the first half of its body (at least one byte, never all of it),
    /// then drop the connection with a reset: a reset mid-body. Not for
    /// `git`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub reset_mid_body: bool,
    /// Members merged into the answer's JSON object, objects member by
    /// member at any depth, other values replacing (fields a newer
    /// coordinator might send, or one bad value in an otherwise normal
    /// answer). Not for `git`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_fields: Option<serde_json::Map<String, Value>>,
    /// Members added to every JSON object of the answer, at any depth,
    /// where no member of that name is: the fields a newer coordinator
    /// adds to its objects (a `traceparent` in `pendingTurn`, say), which
    /// the runner ignores (PROTOCOL 2). Not for `git`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_fields: Option<serde_json::Map<String, Value>>,
}

impl Fault {
    fn new(route: Target) -> Self {
        Fault {
            route,
            status: None,
            reset: false,
            delay_ms: None,
            body: None,
            retry_after: None,
            location: None,
            after: false,
            pad_bytes: None,
            stall_ms: None,
            count: 1,
            reset_mid_body: false,
            merge_fields: None,
            add_fields: None,
        }
    }

    /// The normal answer cut after the first half of its body by a reset,
    /// once (see [`Fault::reset_mid_body`]).
    pub fn reset_mid_body(route: impl Into<Target>) -> Self {
        Fault {
            reset_mid_body: true,
            ..Fault::new(route.into())
        }
    }

    /// The normal answer with `fields` merged into its JSON object, once
    /// (see [`Fault::merge_fields`]).
    pub fn merge_fields(route: impl Into<Target>, fields: serde_json::Map<String, Value>) -> Self {
        Fault {
            merge_fields: Some(fields),
            ..Fault::new(route.into())
        }
    }

    /// Answer `status` (with the default error body) instead of the normal
    /// answer, once.
    pub fn status(route: impl Into<Target>, status: u16) -> Self {
        Fault {
            status: Some(status),
            ..Fault::new(route.into())
        }
    }

    /// Drop the connection without a response, once.
    pub fn reset(route: impl Into<Target>) -> Self {
        Fault {
            reset: true,
            ..Fault::new(route.into())
        }
    }

    /// Wait `delay` before the normal answer, once.
    pub fn delay(route: impl Into<Target>, delay: Duration) -> Self {
        Fault {
            delay_ms: Some(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX)),
            ..Fault::new(route.into())
        }
    }

    /// Answer `200` with `body` (verbatim, e.g. malformed JSON or a session
    /// whose `pendingTurn` has the wrong shape) instead of the normal answer.
    pub fn body(route: impl Into<Target>, body: impl Into<String>) -> Self {
        Fault {
            body: Some(body.into()),
            ..Fault::new(route.into())
        }
    }

    /// The normal answer followed by `bytes` spaces, once (a body over a size
    /// cap that still parses).
    pub fn pad(route: impl Into<Target>, bytes: u64) -> Self {
        Fault {
            pad_bytes: Some(bytes),
            ..Fault::new(route.into())
        }
    }

    /// The normal answer, its body pausing for `stall` after its first
    /// chunk, once.
    pub fn stall(route: impl Into<Target>, stall: Duration) -> Self {
        Fault {
            stall_ms: Some(u64::try_from(stall.as_millis()).unwrap_or(u64::MAX)),
            ..Fault::new(route.into())
        }
    }

    /// The normal answer with `fields` added to each of its JSON objects at
    /// any depth, once (see [`Fault::add_fields`]).
    pub fn add_fields(route: impl Into<Target>, fields: serde_json::Map<String, Value>) -> Self {
        Fault {
            add_fields: Some(fields),
            ..Fault::new(route.into())
        }
    }

    /// The same fault for the next `count` requests.
    pub fn times(mut self, count: u32) -> Self {
        self.count = count;
        self
    }

    /// Adds a wait of `delay` before the answer.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay_ms = Some(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// Adds a `Retry-After: <value>` header to the replacing answer.
    pub fn with_retry_after(mut self, value: impl Into<String>) -> Self {
        self.retry_after = Some(value.into());
        self
    }

    /// Answers `status` with a `Location: <location>` header instead of the
    /// normal answer, once (with a `3xx`, a redirect).
    pub fn redirect(route: impl Into<Target>, status: u16, location: impl Into<String>) -> Self {
        Fault {
            status: Some(status),
            location: Some(location.into()),
            ..Fault::new(route.into())
        }
    }

    /// Handles the request normally first, then replaces or drops its answer.
    pub fn after_handling(mut self) -> Self {
        self.after = true;
        self
    }

    /// Whether the fault replaces the answer with its own status or body.
    pub(crate) fn replaces(&self) -> bool {
        self.status.is_some() || self.body.is_some()
    }

    /// Checks that the fault does something and that its route takes faults.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if matches!(self.route, Target::Dev | Target::Unknown) {
            return Err(format!("route {:?} takes no faults", self.route.name()));
        }
        if self.count == 0 {
            return Err("count must be at least 1".into());
        }
        if let Some(s) = self.status
            && (StatusCode::from_u16(s).is_err() || s < 200)
        {
            return Err(format!("status {s} is not a final HTTP status"));
        }
        if self.reset && self.replaces() {
            return Err("reset drops the connection: it takes no status or body".into());
        }
        if (self.reset_mid_body || self.merge_fields.is_some() || self.add_fields.is_some())
            && self.route == Target::Git
        {
            return Err(
                "resetMidBody, mergeFields and addFields are not supported on the git route".into(),
            );
        }
        if self.reset_mid_body && self.reset {
            return Err(
                "reset drops the connection before any byte: it takes no resetMidBody".into(),
            );
        }
        if !self.reset
            && !self.replaces()
            && self.delay_ms.is_none()
            && self.pad_bytes.is_none()
            && self.stall_ms.is_none()
            && !self.reset_mid_body
            && self.merge_fields.is_none()
            && self.add_fields.is_none()
        {
            return Err("a fault needs reset, status, body, delayMs, padBytes, stallMs, resetMidBody, mergeFields or addFields".into());
        }
        if self.reset && (self.pad_bytes.is_some() || self.stall_ms.is_some()) {
            return Err("reset drops the connection: it takes no padBytes or stallMs".into());
        }
        if self.pad_bytes.is_some() && self.route == Target::Git {
            return Err("padBytes is not supported on the git route".into());
        }
        if self.after && self.route == Target::Git {
            return Err("after is not supported on the git route".into());
        }
        if self.location.is_some() && self.status.is_none() {
            return Err("location needs a status".into());
        }
        if self.after && !self.reset && !self.replaces() {
            return Err("after needs reset, status or body".into());
        }
        Ok(())
    }
}

/// One request the coordinator received (`GET dev/requests`), recorded when
/// it arrived (after its body was read), in order of arrival.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedRequest {
    /// Milliseconds since the coordinator started.
    pub at_ms: u64,
    /// `GET`, `POST`, …
    pub method: String,
    /// The path with its query, e.g. `/api/cli/sessions/s1`.
    pub path: String,
    /// The route the path matched.
    pub route: Target,
    /// Header names (lower case) and values, several values joined by `, `.
    /// The value of `authorization` is masked to its scheme (`Bearer ***`,
    /// `Basic ***`), so no secret is recorded.
    pub headers: BTreeMap<String, String>,
    /// The body as JSON when it parses, else as a (lossy UTF-8) string; `null`
    /// when empty, and always `null` for `git` (see `body_len`).
    pub body: Value,
    /// Size of the body in bytes (for `git`: the `Content-Length`, if any).
    pub body_len: u64,
    /// The status answered; `None` while in flight or when the connection was
    /// dropped by a `reset` fault.
    pub response_status: Option<u16>,
    /// When the answer was ready (its status and headers; a git body streams
    /// after it), on the clock of `at_ms`; `None` while in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_at_ms: Option<u64>,
    /// The fault applied to this request, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<Fault>,
    /// For `git`: the bytes of the response body sent so far (what a clone
    /// or fetch transferred, counted as each chunk is handed to the
    /// connection); 0 for the API routes.
    #[serde(default)]
    pub response_len: u64,
}

impl RecordedRequest {
    /// The value of header `name` (case-insensitive), as recorded.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }
}

/// One run, as the coordinator holds it (`GET dev/state`, [`super::Coordinator::run`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    /// `run-<ordinal>`.
    pub id: String,
    /// 1 for the first run, then +1 per queued turn.
    pub ordinal: u64,
    /// Whether this run carries the session's initial task (`clientInfo.task`)
    /// rather than a queued turn.
    pub initial: bool,
    /// `pending`, `running`, `succeeded`, `failed` or `interrupted`.
    pub status: String,
    /// The prompt: the initial task or the turn's body.
    pub body: String,
    /// Set when the turn answers a question (4.3).
    pub answer_to_question: Option<AnswerToQuestion>,
    /// The W3C trace context `pendingTurn` carries for it (issue 40), when
    /// the dev API's turn gave one.
    pub traceparent: Option<String>,
    /// Accepted events, in `seq` order from 1 without gaps.
    pub events: Vec<Event>,
    /// The first accepted `finish` body (the seal).
    pub finish: Option<FinishBody>,
    /// How many `run_started` requests were accepted.
    pub started_count: u32,
    /// How many `finish` requests were accepted (repeats of the same status
    /// are idempotent and counted here).
    pub finish_count: u32,
}

impl RunRecord {
    /// The highest `seq` accepted (0 when none).
    pub fn accepted_through(&self) -> u64 {
        self.events.last().map_or(0, |e| e.seq)
    }

    /// Whether the run is `pending` or `running`.
    pub fn is_unfinished(&self) -> bool {
        matches!(self.status.as_str(), "pending" | "running")
    }
}

/// A consistent copy of the coordinator's state, as given to
/// [`super::Coordinator::wait_for`] and served by `GET dev/state` (without the
/// requests).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    /// The session exactly as `GET api/cli/sessions/{sid}` serves it (without
    /// faults).
    pub session: Session,
    /// The boot statuses posted, in order of arrival.
    pub statuses: Vec<BootStatusBody>,
    /// The runs, oldest first.
    pub runs: Vec<RunRecord>,
    /// Faults not used up yet.
    pub faults: Vec<Fault>,
    /// The agent state last saved (2.7), as it came.
    pub agent_state: Option<Value>,
    /// Every request received, in order (not part of `GET dev/state`).
    #[serde(skip)]
    pub requests: Vec<RecordedRequest>,
}

impl Snapshot {
    /// The run `id`.
    pub fn run(&self, id: &str) -> Option<&RunRecord> {
        self.runs.iter().find(|r| r.id == id)
    }

    /// The wire names of the statuses posted, in order
    /// (`["ready", "turn_started", …]`).
    pub fn status_names(&self) -> Vec<&'static str> {
        self.statuses.iter().map(|s| s.status.as_str()).collect()
    }

    /// The requests to `route`, in order.
    pub fn requests_to(&self, route: Route) -> Vec<&RecordedRequest> {
        self.requests.iter().filter(|r| r.route == route).collect()
    }
}

/// An error of the API (answered with its status and `{"error": message}`).
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

/// Errors of the dev API and of the in-process controls.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    /// `interrupt` without a run id while no run is `running`.
    #[error("no run is running: name the run to interrupt")]
    NoRunningRun,
    /// The run id names no run.
    #[error("unknown run {0:?}")]
    UnknownRun(String),
    /// The run is already sealed.
    #[error("run {0:?} is already sealed")]
    RunSealed(String),
    /// A fault that does nothing or cannot apply.
    #[error("invalid fault: {0}")]
    InvalidFault(String),
    /// [`super::Coordinator::wait_for`] gave up; `state` is the last state as
    /// JSON, for the test's failure message.
    #[error("condition not met within {waited:?}; last state: {state}")]
    Timeout {
        /// How long it waited.
        waited: Duration,
        /// The last state (`GET dev/state`).
        state: String,
    },
}

/// A live token and when it expires.
struct Issued {
    expires: Instant,
    access: Option<Access>,
}

/// The mutable session. Guarded by one mutex, never held across an await.
pub(crate) struct State {
    pub started: Instant,
    pub status: String,
    pub runs: Vec<RunRecord>,
    pub interrupt_requested_run_id: Option<String>,
    pub agent_session_id: Option<String>,
    pub statuses: Vec<BootStatusBody>,
    pub requests: Vec<RecordedRequest>,
    pub faults: Vec<Fault>,
    /// The git server refuses a push that brings a file (blob) larger than
    /// this many bytes, as GitHub refuses files over 100 MiB; `None`: no
    /// limit.
    pub git_max_file_size: Option<u64>,
    /// The session's `setup` field (`POST dev/setup`); `None`: absent.
    pub setup: Option<crate::wire::SessionSetup>,
    /// The session's `egressCanary` and `instructions` (2.4 extensions).
    pub around: AroundAgent,
    /// The session's `agentState` (2.4 extension): the agent-state route
    /// (2.7) is served, with this cap; `None`: not offered (the route
    /// answers `404`).
    pub agent_state_offer: Option<crate::wire::AgentStateOffer>,
    /// The agent state last saved (2.7), as it came; the load answers it.
    pub agent_state: Option<Value>,
    /// The session's `acceptsReleased` (2.4 extension).
    pub accepts_released: bool,
    bearers: HashMap<String, Issued>,
    repo_tokens: HashMap<String, Issued>,
    /// Every token issued, in order.
    pub issued: Vec<String>,
}

/// The session fields of issue 14's canary and instructions (PROTOCOL.md
/// 2.4 extensions), served as set (no check: tests serve bad values too).
#[derive(Clone, Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AroundAgent {
    /// `egressCanary`: `HOST:PORT` or `https://HOST`.
    #[serde(default)]
    pub egress_canary: Option<String>,
    /// `instructions`: the platform's instructions for the agent.
    #[serde(default)]
    pub instructions: Option<String>,
}

/// Random lower-case hex of `bytes` bytes (2 × `bytes` characters).
pub(crate) fn random_hex(bytes: usize) -> String {
    let mut s = String::with_capacity(bytes * 2);
    for _ in 0..bytes {
        let b = fastrand::u8(..);
        s.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        s.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
    }
    s
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

impl State {
    pub(crate) fn new(initial_task: Option<&str>) -> Self {
        let runs = initial_task
            .map(|task| {
                vec![RunRecord {
                    id: "run-1".into(),
                    ordinal: 1,
                    initial: true,
                    status: "pending".into(),
                    body: task.to_string(),
                    answer_to_question: None,
                    traceparent: None,
                    events: Vec::new(),
                    finish: None,
                    started_count: 0,
                    finish_count: 0,
                }]
            })
            .unwrap_or_default();
        State {
            started: Instant::now(),
            status: "active".into(),
            runs,
            interrupt_requested_run_id: None,
            agent_session_id: None,
            statuses: Vec::new(),
            requests: Vec::new(),
            faults: Vec::new(),
            git_max_file_size: None,
            setup: None,
            around: AroundAgent::default(),
            agent_state_offer: None,
            agent_state: None,
            accepts_released: false,
            bearers: HashMap::new(),
            repo_tokens: HashMap::new(),
            issued: Vec::new(),
        }
    }

    /// Issues a fresh bearer valid for `ttl`: `(token, expiresAt RFC 3339)`.
    pub(crate) fn issue_bearer(&mut self, ttl: Duration) -> (String, String) {
        let token = random_hex(24);
        self.bearers.insert(
            token.clone(),
            Issued {
                expires: Instant::now() + ttl,
                access: None,
            },
        );
        self.issued.push(token.clone());
        (token, rfc3339(SystemTime::now() + ttl))
    }

    /// Expires the bearers `tokens` now (see `Coordinator::expire_bearers`).
    pub(crate) fn expire_bearers(&mut self, tokens: &[String]) {
        let now = Instant::now();
        for token in tokens {
            if let Some(issued) = self.bearers.get_mut(token) {
                issued.expires = now;
            }
        }
    }

    /// Every bearer issued, expired or not.
    pub(crate) fn bearer_tokens(&self) -> Vec<String> {
        self.bearers.keys().cloned().collect()
    }

    /// Whether `token` is a bearer that has not expired.
    pub(crate) fn bearer_live(&self, token: &str) -> bool {
        self.bearers
            .get(token)
            .is_some_and(|i| i.expires > Instant::now())
    }

    /// Issues a repo token for `access` valid for `ttl`.
    pub(crate) fn issue_repo_token(&mut self, access: Access, ttl: Duration) -> (String, String) {
        let token = random_hex(20);
        self.repo_tokens.insert(
            token.clone(),
            Issued {
                expires: Instant::now() + ttl,
                access: Some(access),
            },
        );
        self.issued.push(token.clone());
        (token, rfc3339(SystemTime::now() + ttl))
    }

    /// The access of a live repo token.
    pub(crate) fn repo_token_access(&self, token: &str) -> Option<Access> {
        self.repo_tokens
            .get(token)
            .filter(|i| i.expires > Instant::now())
            .and_then(|i| i.access)
    }

    /// The turn `pendingTurn` shows: the lowest-ordinal unfinished run, unless
    /// that run carries the initial task (which the runner starts through
    /// `runs`, PROTOCOL.md 2.4), in which case none.
    pub(crate) fn pending_turn(&self) -> Option<PendingTurn> {
        let run = self.runs.iter().find(|r| r.is_unfinished())?;
        if run.initial {
            return None;
        }
        Some(PendingTurn {
            turn_id: Some(format!("turn-{}", run.ordinal)),
            ordinal: run.ordinal,
            run_id: run.id.clone(),
            body: run.body.clone(),
            client_message_id: format!("msg-{}", run.ordinal),
            answer_to_question: run.answer_to_question.clone(),
            traceparent: run.traceparent.clone(),
            tracestate: None,
        })
    }

    /// The session as the session route serves it.
    pub(crate) fn session(
        &self,
        workspace_id: &str,
        branch: &str,
        client_info: &ClientInfo,
    ) -> Session {
        Session {
            workspace_id: workspace_id.to_string(),
            repo_branch: branch.to_string(),
            status: Some(self.status.clone()),
            client_info: client_info.clone(),
            runs: self
                .runs
                .iter()
                .rev()
                .map(|r| RunRef {
                    id: r.id.clone(),
                    status: r.status.clone(),
                })
                .collect(),
            pending_turn: Some(
                self.pending_turn()
                    .and_then(|t| serde_json::to_value(t).ok())
                    .unwrap_or(Value::Null),
            ),
            interrupt_requested_run_id: self.interrupt_requested_run_id.clone(),
            agent_session_id: self.agent_session_id.clone(),
            project_id: None,
            setup: self.setup.clone(),
            egress_canary: self.around.egress_canary.clone(),
            instructions: self.around.instructions.clone(),
            agent_state: self.agent_state_offer,
            accepts_released: self.accepts_released,
        }
    }

    /// Queues a turn as run `run-<ordinal>`, `pending`; returns its id.
    pub(crate) fn queue_turn(&mut self, body: String, answer: Option<AnswerToQuestion>) -> String {
        let ordinal = self.runs.len() as u64 + 1;
        let id = format!("run-{ordinal}");
        self.runs.push(RunRecord {
            id: id.clone(),
            ordinal,
            initial: false,
            status: "pending".into(),
            body,
            answer_to_question: answer,
            traceparent: None,
            events: Vec::new(),
            finish: None,
            started_count: 0,
            finish_count: 0,
        });
        id
    }

    /// Gives a queued run the trace context its `pendingTurn` carries.
    pub(crate) fn trace_run(&mut self, id: &str, traceparent: Option<String>) {
        if let Some(run) = self.runs.iter_mut().find(|r| r.id == id) {
            run.traceparent = traceparent;
        }
    }

    pub(crate) fn run(&self, id: &str) -> Option<&RunRecord> {
        self.runs.iter().find(|r| r.id == id)
    }

    fn run_mut(&mut self, id: &str) -> Result<&mut RunRecord, ApiError> {
        self.runs
            .iter_mut()
            .find(|r| r.id == id)
            .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("unknown run {id:?}")))
    }

    /// `run_started`: `pending` → `running`; idempotent; `409` once sealed.
    pub(crate) fn run_started(&mut self, id: &str) -> Result<(), ApiError> {
        let run = self.run_mut(id)?;
        match run.status.as_str() {
            "pending" | "running" => {
                run.status = "running".into();
                run.started_count += 1;
                Ok(())
            }
            other => Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("run {id:?} is already {other}"),
            )),
        }
    }

    /// Accepts the events above the cursor; a gap refuses the whole batch with
    /// `409`. Returns the new cursor.
    pub(crate) fn add_events(&mut self, id: &str, events: Vec<Event>) -> Result<u64, ApiError> {
        let run = self.run_mut(id)?;
        let mut next = run.accepted_through() + 1;
        let mut fresh = Vec::new();
        for e in events {
            if e.seq < next {
                continue;
            }
            if e.seq > next {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    format!(
                        "event seq {} leaves a gap: accepted through {}",
                        e.seq,
                        next - 1
                    ),
                ));
            }
            next += 1;
            fresh.push(e);
        }
        run.events.extend(fresh);
        Ok(run.accepted_through())
    }

    /// `finish`: seals the run; idempotent for the same status, `409` for
    /// another one. Stores `agentSessionId` (when given) and clears
    /// `interruptRequestedRunId` when it named this run.
    pub(crate) fn finish(&mut self, id: &str, body: FinishBody) -> Result<(), ApiError> {
        let run = self.run_mut(id)?;
        let status = body.status.as_str();
        if let Some(seal) = &run.finish {
            if seal.status != body.status {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    format!("run {id:?} is already sealed {}", seal.status.as_str()),
                ));
            }
            run.finish_count += 1;
            return Ok(());
        }
        run.status = status.to_string();
        run.finish_count += 1;
        let agent_session_id = body.agent_session_id.clone();
        run.finish = Some(body);
        if agent_session_id.is_some() {
            self.agent_session_id = agent_session_id;
        }
        if self.interrupt_requested_run_id.as_deref() == Some(id) {
            self.interrupt_requested_run_id = None;
        }
        Ok(())
    }

    /// Requests an interrupt of `run_id`, or of the running run.
    pub(crate) fn interrupt(&mut self, run_id: Option<&str>) -> Result<String, DevError> {
        let id = match run_id {
            Some(id) => {
                let run = self
                    .run(id)
                    .ok_or_else(|| DevError::UnknownRun(id.to_string()))?;
                if !run.is_unfinished() {
                    return Err(DevError::RunSealed(id.to_string()));
                }
                id.to_string()
            }
            None => self
                .runs
                .iter()
                .find(|r| r.status == "running")
                .map(|r| r.id.clone())
                .ok_or(DevError::NoRunningRun)?,
        };
        self.interrupt_requested_run_id = Some(id.clone());
        Ok(id)
    }

    /// Takes one use of the first fault queued for `route`.
    pub(crate) fn take_fault(&mut self, route: Target) -> Option<Fault> {
        let i = self.faults.iter().position(|f| f.route == route)?;
        let f = &mut self.faults[i];
        f.count -= 1;
        let mut taken = f.clone();
        taken.count = 1;
        if f.count == 0 {
            self.faults.remove(i);
        }
        Some(taken)
    }

    pub(crate) fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::RunOutcome;
    use serde_json::json;

    fn ev(seq: u64) -> Event {
        Event {
            seq,
            kind: "output".into(),
            at: "2024-01-01T00:00:00Z".into(),
            data: json!({}),
        }
    }

    fn finish(status: RunOutcome) -> FinishBody {
        FinishBody {
            status,
            agent_session_id: Some("agent-1".into()),
            error: None,
            usage: None,
            result: None,
            agent_session_reset: None,
            resources: None,
        }
    }

    #[test]
    fn pending_turn_skips_the_initial_run_and_follows_finish() {
        let mut s = State::new(Some("task"));
        assert_eq!(s.pending_turn(), None);
        let id = s.queue_turn("second".into(), None);
        assert_eq!(id, "run-2");
        assert_eq!(s.pending_turn(), None, "run-1 is still unfinished");
        s.run_started("run-1").unwrap();
        s.finish("run-1", finish(RunOutcome::Succeeded)).unwrap();
        let t = s.pending_turn().unwrap();
        assert_eq!(
            serde_json::to_value(&t).unwrap(),
            json!({"turnId": "turn-2", "ordinal": 2, "runId": "run-2", "body": "second",
                   "clientMessageId": "msg-2", "answerToQuestion": null})
        );
        s.finish("run-2", finish(RunOutcome::Interrupted)).unwrap();
        assert_eq!(s.pending_turn(), None);
        assert_eq!(s.agent_session_id.as_deref(), Some("agent-1"));
    }

    #[test]
    fn idle_start_exposes_the_first_turn() {
        let mut s = State::new(None);
        assert!(s.runs.is_empty());
        s.queue_turn("first".into(), None);
        assert_eq!(s.pending_turn().unwrap().run_id, "run-1");
    }

    #[test]
    fn events_skip_resends_and_refuse_gaps() {
        let mut s = State::new(Some("t"));
        assert_eq!(s.add_events("run-1", vec![ev(1), ev(2)]).unwrap(), 2);
        assert_eq!(s.add_events("run-1", vec![ev(2), ev(3)]).unwrap(), 3);
        let err = s.add_events("run-1", vec![ev(5)]).unwrap_err();
        assert_eq!(err.status, StatusCode::CONFLICT);
        assert_eq!(s.run("run-1").unwrap().accepted_through(), 3);
        assert_eq!(
            s.add_events("nope", vec![]).unwrap_err().status,
            StatusCode::NOT_FOUND
        );
    }

    #[test]
    fn finish_is_idempotent_for_the_same_status_only() {
        let mut s = State::new(Some("t"));
        s.interrupt(Some("run-1")).unwrap();
        s.finish("run-1", finish(RunOutcome::Interrupted)).unwrap();
        assert_eq!(s.interrupt_requested_run_id, None);
        s.finish("run-1", finish(RunOutcome::Interrupted)).unwrap();
        assert_eq!(s.run("run-1").unwrap().finish_count, 2);
        let err = s
            .finish("run-1", finish(RunOutcome::Succeeded))
            .unwrap_err();
        assert_eq!(err.status, StatusCode::CONFLICT);
        assert_eq!(
            s.run_started("run-1").unwrap_err().status,
            StatusCode::CONFLICT
        );
        assert!(matches!(
            s.interrupt(Some("run-1")),
            Err(DevError::RunSealed(_))
        ));
        assert!(matches!(s.interrupt(None), Err(DevError::NoRunningRun)));
    }

    #[test]
    fn faults_are_used_up_in_order() {
        let mut s = State::new(None);
        s.faults.push(Fault::status(Route::Session, 503).times(2));
        s.faults.push(Fault::reset(Route::Session));
        assert_eq!(
            s.take_fault(Target::Route(Route::Session)).unwrap().status,
            Some(503)
        );
        assert_eq!(s.take_fault(Target::Route(Route::Events)), None);
        assert_eq!(
            s.take_fault(Target::Route(Route::Session)).unwrap().status,
            Some(503)
        );
        assert!(s.take_fault(Target::Route(Route::Session)).unwrap().reset);
        assert_eq!(s.take_fault(Target::Route(Route::Session)), None);
    }

    /// The names of `POST dev/faults` and `GET dev/requests`, as PROTOCOL.md
    /// section 6 spells them (the table's names for its routes).
    #[test]
    fn route_names_are_those_of_the_dev_api() {
        let all = [
            (Target::Route(Route::AgentToken), "agent-token"),
            (Target::Route(Route::BootStatus), "boot-status"),
            (Target::Route(Route::EnvBundle), "env-bundle"),
            (Target::Route(Route::Session), "session"),
            (Target::Route(Route::RepoToken), "repo-token"),
            (Target::Route(Route::RunStarted), "run-started"),
            (Target::Route(Route::Events), "events"),
            (Target::Route(Route::Cursor), "cursor"),
            (Target::Route(Route::Finish), "finish"),
            (Target::Route(Route::AgentStateLoad), "agent-state-load"),
            (Target::Route(Route::AgentStateSave), "agent-state-save"),
            (Target::Git, "git"),
            (Target::Dev, "dev"),
            (Target::Unknown, "unknown"),
        ];
        for (target, name) in all {
            assert_eq!(serde_json::to_value(target).unwrap(), json!(name));
            assert_eq!(
                serde_json::from_value::<Target>(json!(name)).unwrap(),
                target
            );
            assert_eq!(target.api().map(Target::from), target.api().map(|_| target));
        }
        assert_eq!(Route::all().count(), 11);
        // Through the request's parser: the 400 a developer reads.
        let err = crate::server::parse::<Target>(br#""sesions""#)
            .unwrap_err()
            .message;
        assert!(
            err.contains("unknown route `sesions`: one of agent-token,"),
            "{err}"
        );
    }

    #[test]
    fn faults_are_validated() {
        assert!(Fault::status(Target::Dev, 503).validate().is_err());
        assert!(
            Fault::status(Route::Session, 503)
                .times(0)
                .validate()
                .is_err()
        );
        assert!(Fault::status(Route::Session, 42).validate().is_err());
        let nothing = Fault {
            status: None,
            ..Fault::status(Route::Session, 503)
        };
        assert!(nothing.validate().is_err());
        assert!(
            Fault::delay(Route::Session, Duration::from_millis(5))
                .validate()
                .is_ok()
        );
        let f: Fault =
            serde_json::from_value(json!({"route": "run-started", "status": 503})).unwrap();
        assert_eq!(f, Fault::status(Route::RunStarted, 503));
        assert!(Fault::pad(Route::Session, 10).validate().is_ok());
        assert!(Fault::pad(Target::Git, 10).validate().is_err());
        assert!(
            Fault::stall(Target::Git, Duration::from_millis(5))
                .validate()
                .is_ok()
        );
        let reset_and_stall = Fault {
            stall_ms: Some(5),
            ..Fault::reset(Target::Git)
        };
        assert!(reset_and_stall.validate().is_err());
        let f: Fault =
            serde_json::from_value(json!({"route": "session", "padBytes": 9, "stallMs": 3}))
                .unwrap();
        assert_eq!((f.pad_bytes, f.stall_ms), (Some(9), Some(3)));
        let f: Fault = serde_json::from_value(
            json!({"route": "env-bundle", "status": 307, "location": "http://elsewhere/"}),
        )
        .unwrap();
        assert_eq!(
            f,
            Fault::redirect(Route::EnvBundle, 307, "http://elsewhere/")
        );
        assert!(f.validate().is_ok());
        let no_status = Fault { status: None, ..f };
        assert!(no_status.validate().is_err());
    }
}
