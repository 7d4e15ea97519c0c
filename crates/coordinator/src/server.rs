//! The HTTP side of the coordinator: one handler that records every request,
//! applies injected faults, and dispatches to the routes of PROTOCOL.md
//! section 2 (by the route table, [`crate::wire::routes`]), the git
//! smart-HTTP routes and the dev API (section 6, [`super::dev`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request, State as AxumState};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use futures_util::StreamExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::conn::ConnHandle;
use super::dev;
use super::fleet::Fleet;
use super::git::{self, BareRepo};
use super::state::{ApiError, DevError, Fault, RecordedRequest, Snapshot, State, Target};
use crate::secret::Secret;
use crate::wire::routes::{self, Ack, Auth, Endpoint, Param, Route};
use crate::wire::{
    AcceptedThrough, AgentStateAnswer, AgentStateOffer, AgentTokenResponse, ClientInfo, Connector,
    EnvBundle, ExpiresAt, RepoTokenResponse, SessionEnvelope,
};

/// Largest API request body read (the git routes stream without a limit);
/// also the largest agent-state offer (`--agent-state-max-bytes`).
pub(crate) const MAX_API_BODY: usize = 16 * 1024 * 1024;

/// Immutable settings of a running coordinator.
pub(crate) struct Config {
    pub session_id: String,
    pub workspace_id: String,
    pub repo_full_name: String,
    pub branch: String,
    pub client_info: ClientInfo,
    pub connectors: Vec<(String, String)>,
    /// Connectors served with `"scope": "setup"`.
    pub setup_connectors: Vec<(String, String)>,
    pub redact_vars: Vec<String>,
    pub bearer_ttl: Duration,
    /// See `CoordinatorOptions::clock_offset_s`.
    pub clock_offset_s: i64,
    /// See `CoordinatorOptions::bearer_expires_in_s`.
    pub bearer_expires_in_s: Option<i64>,
    pub repo_token_ttl: Duration,
    pub repo_token_expires_at: bool,
    pub boot_secret: Secret,
    /// Required on the dev API when set (non-loopback listen).
    pub dev_token: Option<Secret>,
    /// Offer the long-poll of the session read (PROTOCOL.md 2.4).
    pub long_poll: bool,
    pub repo: BareRepo,
    /// Repositories and LFS objects served beside `repo` ([`super::served`]).
    pub served: super::served::Served,
    /// [`super::CoordinatorOptions::latency`].
    pub latency: Duration,
    /// [`super::CoordinatorOptions::counts_only`].
    pub counts_only: bool,
}

/// What the handler shares: settings, state, and a signal for waiters.
pub(crate) struct Shared {
    pub cfg: Config,
    pub state: Mutex<State>,
    pub changed: Notify,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        crate::lock(&self.state)
    }

    /// A consistent copy of the state.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let st = self.lock();
        Snapshot {
            session: st.session(
                &self.cfg.workspace_id,
                &self.cfg.branch,
                &self.cfg.client_info,
            ),
            statuses: st.statuses.clone(),
            runs: st.runs.clone(),
            faults: st.faults.clone(),
            agent_state: st.agent_state.clone(),
            requests: st.requests.clone(),
        }
    }

    /// Runs `f` on the state, then wakes the waiters.
    pub(crate) fn update<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let out = f(&mut self.lock());
        self.changed.notify_waiters();
        out
    }

    pub(crate) fn add_fault(&self, fault: Fault) -> Result<(), DevError> {
        fault.validate().map_err(DevError::InvalidFault)?;
        self.update(|st| st.faults.push(fault));
        Ok(())
    }
}

/// The router: every request goes through [`handle`], for the session of
/// the fleet it is for ([`Fleet::pick`]).
pub(crate) fn router(fleet: Arc<Fleet>) -> Router {
    Router::new().fallback(handle).with_state(fleet)
}

/// A request's path, parsed: its [`Target`] and what the target needs of
/// the path (a route's parameter, the path below `git/` or `dev/`).
enum ParsedPath {
    /// A route of the table, with the value of its path parameter.
    Api(Route, String),
    /// The path below `/git`, starting with `/`.
    Git(String),
    /// The path below `/dev/`.
    Dev(String),
    Unknown,
}

impl ParsedPath {
    fn target(&self) -> Target {
        match self {
            ParsedPath::Api(route, _) => Target::Route(*route),
            ParsedPath::Git(_) => Target::Git,
            ParsedPath::Dev(_) => Target::Dev,
            ParsedPath::Unknown => Target::Unknown,
        }
    }
}

fn classify(method: &Method, path: &str) -> ParsedPath {
    if let Some(rest) = path.strip_prefix("/git/") {
        return ParsedPath::Git(format!("/{rest}"));
    }
    if let Some(rest) = path.strip_prefix("/dev/") {
        return ParsedPath::Dev(rest.to_string());
    }
    match routes::match_request(method.as_str(), path) {
        Some((route, value)) => ParsedPath::Api(route, value),
        None => ParsedPath::Unknown,
    }
}

/// Headers for the record: names lower case, several values joined, the
/// `authorization` value masked to its scheme.
fn recorded_headers(headers: &HeaderMap) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in headers {
        let text = if name == header::AUTHORIZATION || name == header::PROXY_AUTHORIZATION {
            let v = value.to_str().unwrap_or("");
            match v.split_once(' ') {
                Some((scheme, _)) => format!("{scheme} ***"),
                None => "***".to_string(),
            }
        } else {
            String::from_utf8_lossy(value.as_bytes()).into_owned()
        };
        out.entry(name.as_str().to_string())
            .and_modify(|v| {
                v.push_str(", ");
                v.push_str(&text);
            })
            .or_insert(text);
    }
    out
}

fn recorded_body(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

fn json_response<T: Serialize>(status: StatusCode, body: &T) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        bytes,
    )
        .into_response()
}

pub(super) fn ok<T: Serialize>(body: &T) -> Response {
    json_response(StatusCode::OK, body)
}

/// The `200` answer of `endpoint`, of its row's answer type.
fn answer<Q, R: Serialize>(_endpoint: Endpoint<Q, R>, body: &R) -> Reply {
    Ok(ok(body))
}

/// The request body of `endpoint`, decoded as its row's request type.
fn request_body<Q: DeserializeOwned, R>(
    _endpoint: Endpoint<Q, R>,
    bytes: &[u8],
) -> Result<Q, ApiError> {
    parse(bytes)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = json_response(self.status, &json!({"error": self.message}));
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"hosted-boot\""),
            );
        }
        resp
    }
}

fn fault_response(f: &Fault) -> Response {
    let status = f
        .status
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::OK);
    let body = f
        .body
        .clone()
        .unwrap_or_else(|| r#"{"error":"injected fault"}"#.to_string());
    let mut resp = (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response();
    if let Some(v) = f
        .retry_after
        .as_deref()
        .and_then(|v| HeaderValue::from_str(v).ok())
    {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    if let Some(v) = f
        .location
        .as_deref()
        .and_then(|v| HeaderValue::from_str(v).ok())
    {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    resp
}

/// A git answer whose body bytes are added to its record's
/// `response_len` as they are streamed (a clone's transfer, for the
/// benchmarks and the mirror's tests), each chunk counted before it is sent.
fn counted(resp: Response, sh: Arc<Shared>, index: usize) -> Response {
    let (parts, body) = resp.into_parts();
    let stream = body.into_data_stream().map(move |chunk| {
        if let Ok(bytes) = &chunk {
            let mut st = sh.lock();
            if let Some(r) = st.requests.get_mut(index) {
                r.response_len += bytes.len() as u64;
            }
        }
        chunk
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

/// Space chunks the `padBytes` fault streams (never the whole pad at once).
const PAD_CHUNK: usize = 64 * 1024;

/// The `padBytes` and `stallMs` faults applied to the answer about to be
/// sent (its status and headers stay).
fn shaped(resp: Response, f: &Fault) -> Response {
    if f.pad_bytes.is_none() && f.stall_ms.is_none() {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    // A whole body's length is in its size hint (hyper writes the header).
    let length = axum::body::HttpBody::size_hint(&body).exact();
    let mut stream: futures_util::stream::BoxStream<'static, Result<Bytes, axum::Error>> =
        Box::pin(body.into_data_stream());
    if let Some(pad) = f.pad_bytes {
        if let Some(len) = length {
            parts
                .headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(len + pad));
        }
        let spaces = Bytes::from(vec![b' '; PAD_CHUNK]);
        let chunks = (0..pad.div_ceil(PAD_CHUNK as u64)).map(move |i| {
            let left = pad - i * PAD_CHUNK as u64;
            Ok(spaces.slice(..usize::try_from(left).unwrap_or(PAD_CHUNK).min(PAD_CHUNK)))
        });
        stream = Box::pin(stream.chain(futures_util::stream::iter(chunks)));
    }
    if let Some(ms) = f.stall_ms {
        stream = stalled(stream, Duration::from_millis(ms));
    }
    Response::from_parts(parts, Body::from_stream(stream))
}

/// Where the `stallMs` fault's body is: before its first chunk, paused
/// with the second half of that chunk held back, or past the pause.
enum StallStep {
    First,
    Paused(Option<Bytes>),
    Rest,
}

/// `stream` with a pause of `stall` after the first half of its first chunk
/// (at least one byte). Splitting the chunk makes the pause bite on any
/// body: when a whole answer fits one chunk (git-http-backend's short
/// advertisement, written before the server reads it), a client that
/// stops reading once it has what it needs would otherwise never see it.
fn stalled(
    stream: futures_util::stream::BoxStream<'static, Result<Bytes, axum::Error>>,
    stall: Duration,
) -> futures_util::stream::BoxStream<'static, Result<Bytes, axum::Error>> {
    Box::pin(futures_util::stream::unfold(
        (stream, StallStep::First),
        move |(mut stream, step)| async move {
            match step {
                StallStep::First => match stream.next().await? {
                    Ok(chunk) if chunk.len() > 1 => {
                        let half = chunk.len() / 2;
                        let held = chunk.slice(half..);
                        Some((
                            Ok(chunk.slice(..half)),
                            (stream, StallStep::Paused(Some(held))),
                        ))
                    }
                    item => Some((item, (stream, StallStep::Paused(None)))),
                },
                StallStep::Paused(held) => {
                    tokio::time::sleep(stall).await;
                    let item = match held {
                        Some(chunk) => Ok(chunk),
                        None => stream.next().await?,
                    };
                    Some((item, (stream, StallStep::Rest)))
                }
                StallStep::Rest => {
                    let item = stream.next().await?;
                    Some((item, (stream, StallStep::Rest)))
                }
            }
        },
    ))
}

/// The answer with the `mergeFields` fault ([`merge_into`]) and the
/// `addFields` fault ([`add_everywhere`]) applied; an answer that is not a
/// JSON object is sent unchanged.
async fn edited(
    resp: Response,
    merge: Option<&serde_json::Map<String, Value>>,
    add: Option<&serde_json::Map<String, Value>>,
) -> Response {
    let (mut parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_API_BODY).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let bytes = match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(mut object)) => {
            if let Some(fields) = merge {
                merge_into(&mut object, fields);
            }
            let mut value = Value::Object(object);
            if let Some(fields) = add {
                add_everywhere(&mut value, fields);
            }
            Bytes::from(value.to_string())
        }
        _ => bytes,
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(bytes))
}

/// `fields` into `object`: objects member by member at any depth, any other
/// value replacing what was there.
fn merge_into(
    object: &mut serde_json::Map<String, Value>,
    fields: &serde_json::Map<String, Value>,
) {
    for (k, v) in fields {
        match (object.get_mut(k), v) {
            (Some(Value::Object(inner)), Value::Object(more)) => merge_into(inner, more),
            _ => {
                object.insert(k.clone(), v.clone());
            }
        }
    }
}

/// `fields` into every object of `value` at any depth, where absent.
fn add_everywhere(value: &mut Value, fields: &serde_json::Map<String, Value>) {
    match value {
        Value::Object(object) => {
            for member in object.values_mut() {
                add_everywhere(member, fields);
            }
            for (k, v) in fields {
                object.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| add_everywhere(v, fields)),
        _ => {}
    }
}

/// The `resetMidBody` fault: the answer's status, headers and whole
/// `Content-Length`, the first half of its body, then a reset of the
/// connection (the client sees a body that fails, never a complete answer).
async fn cut_mid_body(resp: Response, conn: ConnHandle) -> Response {
    let (mut parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    let half = bytes.slice(..bytes.len() / 2);
    let first = futures_util::stream::iter([Ok::<Bytes, axum::Error>(half)]);
    let reset = futures_util::stream::once(async move {
        // Time for the first half to reach the wire before the reset.
        tokio::time::sleep(Duration::from_millis(20)).await;
        conn.kill();
        Err(axum::Error::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection reset mid-body by an injected fault",
        )))
    });
    Response::from_parts(parts, Body::from_stream(first.chain(reset)))
}

/// The one handler: reads the body, records the request and takes a queued
/// fault ([`record`]), answers ([`respond`]), records the answer's status,
/// and shapes what is sent by the fault ([`deliver`]).
async fn handle(
    AxumState(fleet): AxumState<Arc<Fleet>>,
    ConnectInfo(conn): ConnectInfo<ConnHandle>,
    req: Request,
) -> Response {
    let (sh, dev_below) = fleet.pick(req.uri().path(), req.headers());
    let parsed = match dev_below {
        Some(below) => ParsedPath::Dev(below),
        None => classify(req.method(), req.uri().path()),
    };
    let target = parsed.target();
    let (parts, body) = req.into_parts();
    let body = read_body(target, &parts.headers, body).await;

    if matches!(&parsed, ParsedPath::Dev(rest) if rest == "sessions") && !body.too_large {
        return super::fleet::dev_sessions(&fleet, &parts.method, &parts.headers, &body.bytes)
            .await
            .unwrap_or_else(IntoResponse::into_response);
    }

    let (index, fault) = record(&sh, &parts, target, &body);
    super::latency::answer_after(sh.cfg.latency, target).await;
    if let Some(ms) = fault.as_ref().and_then(|f| f.delay_ms) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let answer = respond(&sh, parsed, &parts, body, fault.as_ref()).await;

    let status = answer.as_ref().map(|r| r.status().as_u16());
    sh.update(|st| {
        let now = st.elapsed_ms();
        if let Some(r) = st.requests.get_mut(index) {
            r.response_status = status;
            r.answered_at_ms = Some(now);
        }
    });
    tracing::debug!(
        method = %parts.method,
        path = %parts.uri.path(),
        route = target.name(),
        status = status.map_or_else(|| "none".to_string(), |s| s.to_string()),
        "coordinator request"
    );
    deliver(answer, target, fault.as_ref(), &sh, index, conn).await
}

/// A request's body: an API body read whole (up to [`MAX_API_BODY`]), a git
/// body left to stream to `git http-backend` (its length from the header).
struct ReadBody {
    bytes: Bytes,
    git: Option<Body>,
    len: u64,
    too_large: bool,
}

async fn read_body(route: Target, headers: &HeaderMap, body: Body) -> ReadBody {
    if route == Target::Git {
        let len = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        return ReadBody {
            bytes: Bytes::new(),
            git: Some(body),
            len,
            too_large: false,
        };
    }
    match axum::body::to_bytes(body, MAX_API_BODY).await {
        Ok(bytes) => ReadBody {
            len: bytes.len() as u64,
            bytes,
            git: None,
            too_large: false,
        },
        Err(_) => ReadBody {
            bytes: Bytes::new(),
            git: None,
            len: 0,
            too_large: true,
        },
    }
}

/// Records the request (git bodies and, with `counts_only`, every body as
/// null) and takes the route's queued fault, unless the body was too large;
/// returns the record's index and the fault.
fn record(
    sh: &Shared,
    parts: &axum::http::request::Parts,
    route: Target,
    body: &ReadBody,
) -> (usize, Option<Fault>) {
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string());
    sh.update(|st| {
        let fault = if body.too_large {
            None
        } else {
            st.take_fault(route)
        };
        st.requests.push(RecordedRequest {
            at_ms: st.elapsed_ms(),
            method: parts.method.to_string(),
            path,
            route,
            headers: recorded_headers(&parts.headers),
            body: if route == Target::Git || sh.cfg.counts_only {
                Value::Null
            } else {
                recorded_body(&body.bytes)
            },
            body_len: body.len,
            response_status: None,
            answered_at_ms: None,
            fault: fault.clone(),
            response_len: 0,
        });
        (st.requests.len() - 1, fault)
    })
}

/// The answer: 413 for a body too large; else the route's own, unless the
/// fault replaces it before or after (a reset fault: `None`, nothing sent).
async fn respond(
    sh: &Arc<Shared>,
    parsed: ParsedPath,
    parts: &axum::http::request::Parts,
    body: ReadBody,
    fault: Option<&Fault>,
) -> Option<Response> {
    if body.too_large {
        return Some(
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "request body too large").into_response(),
        );
    }
    match fault {
        Some(f) if !f.after && f.reset => None,
        Some(f) if !f.after && f.replaces() => Some(fault_response(f)),
        _ => {
            let normal = dispatch(
                sh,
                parsed,
                &parts.method,
                &parts.uri,
                &parts.headers,
                body.bytes,
                body.git,
            )
            .await;
            match fault {
                Some(f) if f.after && f.reset => None,
                Some(f) if f.after && f.replaces() => Some(fault_response(f)),
                _ => Some(normal),
            }
        }
    }
}

/// What is sent: a git answer counted as it streams; an API answer edited,
/// delayed or cut mid-body by the fault; no answer: the connection dropped.
async fn deliver(
    answer: Option<Response>,
    route: Target,
    fault: Option<&Fault>,
    sh: &Arc<Shared>,
    index: usize,
    conn: ConnHandle,
) -> Response {
    match answer {
        Some(resp) if route == Target::Git => {
            let resp = match fault {
                Some(f) => shaped(resp, f),
                None => resp,
            };
            counted(resp, sh.clone(), index)
        }
        Some(resp) => match fault {
            Some(f) => {
                let resp = match (&f.merge_fields, &f.add_fields) {
                    (None, None) => resp,
                    (merge, add) => edited(resp, merge.as_ref(), add.as_ref()).await,
                };
                let resp = shaped(resp, f);
                if f.reset_mid_body {
                    cut_mid_body(resp, conn).await
                } else {
                    resp
                }
            }
            None => resp,
        },
        None => {
            // The connection fails its next write, so this is never sent.
            conn.kill();
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

pub(super) type Reply = Result<Response, ApiError>;

fn allow(method: &Method, allowed: routes::Method) -> Result<(), ApiError> {
    if method.as_str() == allowed.as_str() {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("use {} on this route", allowed.as_str()),
        ))
    }
}

pub(super) fn auth_value<'a>(headers: &'a HeaderMap, scheme: &str) -> Option<&'a str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (s, rest) = v.split_once(' ')?;
    s.eq_ignore_ascii_case(scheme).then(|| rest.trim())
}

pub(super) fn unauthorized(what: &str) -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        format!("missing or invalid {what}"),
    )
}

/// A request's body as a `T`; a 400 that names the member and the kind of
/// value found, never its text (the runner may quote the answer in an
/// event, and the body may be an agent state).
pub(super) fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    crate::wire::decode::from_slice(bytes)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("malformed body: {e}")))
}

impl Shared {
    fn check_session(&self, sid: &str) -> Result<(), ApiError> {
        if sid == self.cfg.session_id {
            Ok(())
        } else {
            Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("unknown session {sid:?}"),
            ))
        }
    }

    fn check_boot_secret(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        match auth_value(headers, "Bearer") {
            Some(v) if v == self.cfg.boot_secret.expose() => Ok(()),
            _ => Err(unauthorized("boot secret")),
        }
    }

    fn check_bearer(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        match auth_value(headers, "Bearer") {
            Some(v) if self.lock().bearer_live(v) => Ok(()),
            _ => Err(unauthorized("bearer")),
        }
    }

    fn check_run(&self, rid: &str) -> Result<(), ApiError> {
        match self.lock().run(rid) {
            Some(_) => Ok(()),
            None => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("unknown run {rid:?}"),
            )),
        }
    }

    pub(super) fn session_envelope(&self) -> SessionEnvelope {
        let st = self.lock();
        SessionEnvelope {
            session: st.session(
                &self.cfg.workspace_id,
                &self.cfg.branch,
                &self.cfg.client_info,
            ),
        }
    }
}

async fn dispatch(
    sh: &Shared,
    parsed: ParsedPath,
    method: &Method,
    uri: &axum::http::Uri,
    headers: &HeaderMap,
    body: Bytes,
    git_body: Option<Body>,
) -> Response {
    let reply = match parsed {
        ParsedPath::Git(path_info) => {
            let body = git_body.unwrap_or_else(Body::empty);
            return git_route(
                sh,
                method,
                &path_info,
                uri.query().unwrap_or(""),
                headers,
                body,
            )
            .await;
        }
        ParsedPath::Dev(rest) => {
            dev::route(sh, method, &rest, uri.query().unwrap_or(""), headers, &body)
        }
        ParsedPath::Unknown => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "no such route: {method} {} (the routes are listed in PROTOCOL.md section 2; \
                 the dev API is under /dev/, section 6)",
                uri.path()
            ),
        )),
        ParsedPath::Api(route, value) => {
            let reply = api_route(sh, route, &value, method, headers, &body);
            if route == Route::Session && sh.cfg.long_poll && reply.is_ok() {
                return super::long_poll::session_answer(sh, headers).await;
            }
            reply
        }
    };
    reply.unwrap_or_else(IntoResponse::into_response)
}

/// The routes of PROTOCOL.md section 2. Order of checks: method (405), auth
/// (401), session or run (404), all three as the route's row says; then
/// body (400), state (409). Each arm decodes and answers its row's body
/// types.
fn api_route(
    sh: &Shared,
    route: Route,
    value: &str,
    method: &Method,
    headers: &HeaderMap,
    body: &[u8],
) -> Reply {
    let spec = route.spec();
    allow(method, spec.method)?;
    match spec.auth {
        Auth::BootSecret => sh.check_boot_secret(headers)?,
        Auth::Bearer => sh.check_bearer(headers)?,
    }
    match spec.param {
        Param::SessionId => sh.check_session(value)?,
        Param::RunId => sh.check_run(value)?,
    }
    // One handler per row: each decodes and answers its row's body types.
    match route {
        Route::AgentToken => agent_token(sh),
        Route::BootStatus => boot_status(sh, body),
        Route::EnvBundle => env_bundle(sh),
        Route::Session => answer(routes::SESSION, &sh.session_envelope()),
        Route::RepoToken => repo_token(sh, body),
        Route::RunStarted => {
            // The body (`{}`) is not read: nothing in it to check.
            sh.update(|st| st.run_started(value))?;
            answer(routes::RUN_STARTED, &Ack::OK)
        }
        Route::Events => events(sh, value, body),
        Route::Cursor => {
            let n = sh.lock().run(value).map_or(0, |r| r.accepted_through());
            answer(
                routes::CURSOR,
                &AcceptedThrough {
                    accepted_through: n,
                },
            )
        }
        Route::Finish => {
            let fin = request_body(routes::FINISH, body)?;
            sh.update(|st| st.finish(value, fin))?;
            answer(routes::FINISH, &Ack::OK)
        }
        Route::AgentStateLoad => {
            offered_agent_state(sh)?;
            let agent_state = sh.lock().agent_state.clone();
            answer(routes::AGENT_STATE_LOAD, &AgentStateAnswer { agent_state })
        }
        Route::AgentStateSave => agent_state_save(sh, body),
    }
}

/// The session's agent-state offer (2.4); `404` when it makes none, as a
/// coordinator without the extension answers.
fn offered_agent_state(sh: &Shared) -> Result<AgentStateOffer, ApiError> {
    match sh.lock().agent_state_offer {
        Some(offer) => Ok(offer),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "this session offers no agent state (session.agentState is absent)",
        )),
    }
}

/// 2.7 save: a body over the offer's cap is `413`; one that is not an
/// [`crate::wire::AgentState`] `400`; otherwise it replaces the last.
fn agent_state_save(sh: &Shared, body: &[u8]) -> Reply {
    let offer = offered_agent_state(sh)?;
    if body.len() as u64 > offer.max_bytes {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the agent state is {} bytes, over this session's session.agentState.maxBytes ({})",
                body.len(),
                offer.max_bytes
            ),
        ));
    }
    let state = request_body(routes::AGENT_STATE_SAVE, body)?;
    let value = serde_json::to_value(&state)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    sh.update(|st| st.agent_state = Some(value));
    answer(routes::AGENT_STATE_SAVE, &Ack::OK)
}

/// 2.1: a fresh bearer, valid for the configured TTL.
fn agent_token(sh: &Shared) -> Reply {
    let (token, expires_at) = sh.update(|st| st.issue_bearer(sh.cfg.bearer_ttl));
    let shown = shown_clock(&sh.cfg);
    let expires_at = match &shown {
        Some((_, expires)) => expires.clone(),
        None => expires_at,
    };
    let mut reply = answer(
        routes::AGENT_TOKEN,
        &AgentTokenResponse {
            token: token.into(),
            expires_at: Some(ExpiresAt::Rfc3339(expires_at)),
        },
    )?;
    if let Some((date, _)) = shown
        && let Ok(value) = HeaderValue::from_str(&date)
    {
        reply.headers_mut().insert(header::DATE, value);
    }
    Ok(reply)
}

/// The clock an agent-token answer shows when a knob moves it
/// (`clock_offset_s`, `bearer_expires_in_s`): its `Date` header and its
/// `expiresAt`; `None` without either knob.
fn shown_clock(cfg: &Config) -> Option<(String, String)> {
    if cfg.clock_offset_s == 0 && cfg.bearer_expires_in_s.is_none() {
        return None;
    }
    let shift = |t: SystemTime, s: i64| {
        let d = Duration::from_secs(s.unsigned_abs());
        if s >= 0 {
            t.checked_add(d)
        } else {
            t.checked_sub(d)
        }
        .unwrap_or(t)
    };
    let now = shift(SystemTime::now(), cfg.clock_offset_s);
    let ttl = i64::try_from(cfg.bearer_ttl.as_secs()).unwrap_or(i64::MAX);
    let expires = shift(now, cfg.bearer_expires_in_s.unwrap_or(ttl));
    Some((
        httpdate::fmt_http_date(now),
        humantime::format_rfc3339_millis(expires).to_string(),
    ))
}

/// 2.2: the status is recorded, in order of arrival.
fn boot_status(sh: &Shared, body: &[u8]) -> Reply {
    let status = request_body(routes::BOOT_STATUS, body)?;
    sh.update(|st| st.statuses.push(status));
    answer(routes::BOOT_STATUS, &Ack::OK)
}

/// 2.3: the connectors as configured (no check, so that tests can serve
/// reserved names).
fn env_bundle(sh: &Shared) -> Reply {
    let cfg = &sh.cfg;
    answer(
        routes::ENV_BUNDLE,
        &EnvBundle {
            connectors: cfg
                .connectors
                .iter()
                .map(|(k, v)| Connector {
                    env_var: k.clone(),
                    value: v.as_str().into(),
                    scope: None,
                })
                .chain(cfg.setup_connectors.iter().map(|(k, v)| Connector {
                    env_var: k.clone(),
                    value: v.as_str().into(),
                    scope: Some("setup".into()),
                }))
                .collect(),
            redact_vars: cfg.redact_vars.clone(),
        },
    )
}

/// 2.5: a repo token of the access asked for.
fn repo_token(sh: &Shared, body: &[u8]) -> Reply {
    let cfg = &sh.cfg;
    let req = request_body(routes::REPO_TOKEN, body)?;
    let (token, expires_at) = sh.update(|st| st.issue_repo_token(req.access, cfg.repo_token_ttl));
    answer(
        routes::REPO_TOKEN,
        &RepoTokenResponse {
            token: token.into(),
            expires_at: cfg
                .repo_token_expires_at
                .then_some(ExpiresAt::Rfc3339(expires_at)),
            repo_full_name: Some(cfg.repo_full_name.clone()),
            artifacts_remote: None,
        },
    )
}

/// 2.6 events: those above the cursor are accepted (a gap is `409`).
fn events(sh: &Shared, rid: &str, body: &[u8]) -> Reply {
    let mut events = request_body(routes::EVENTS, body)?;
    if sh.cfg.counts_only {
        for e in &mut events.events {
            e.data = Value::Null;
        }
    }
    let n = sh.update(|st| st.add_events(rid, events.events))?;
    answer(
        routes::EVENTS,
        &AcceptedThrough {
            accepted_through: n,
        },
    )
}

/// `{base}/git/{owner}/{name}.git/...`: Basic auth with user `x-access-token`
/// and a live repo token; a push needs a `write` token (else `403`).
async fn git_route(
    sh: &Shared,
    method: &Method,
    path_info: &str,
    query: &str,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    let prefix = format!("/{}.git/", sh.cfg.repo_full_name);
    let other = (!path_info.starts_with(&prefix))
        .then(|| sh.cfg.served.repository_of(path_info))
        .flatten();
    if (!path_info.starts_with(&prefix) && other.is_none())
        || path_info.split('/').any(|s| s == "..")
    {
        return (StatusCode::NOT_FOUND, "no such repository\n").into_response();
    }
    let password = auth_value(headers, "Basic")
        .and_then(|b64| base64::engine::general_purpose::STANDARD.decode(b64).ok())
        .and_then(|raw| String::from_utf8(raw).ok())
        .and_then(|cred| {
            let (user, pass) = cred.split_once(':')?;
            (user == "x-access-token").then(|| pass.to_string())
        });
    let access = password.and_then(|p| sh.lock().repo_token_access(&p));
    let Some(access) = access else {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Basic realm=\"hosted-boot\"")],
            "authentication required: user x-access-token, password a repo token\n",
        )
            .into_response();
    };
    if git::is_push(path_info, query) && (access != crate::wire::Access::Write || other.is_some()) {
        return (StatusCode::FORBIDDEN, "this repo token is read-only\n").into_response();
    }
    let repo = other.as_ref().unwrap_or(&sh.cfg.repo);
    if let Some(full_name) = repo_full_name_of(repo)
        && path_info.starts_with(&format!("/{full_name}.git/info/lfs/"))
    {
        // The LFS batch API's bodies are small JSON: read whole, capped.
        let Ok(bytes) = axum::body::to_bytes(body, MAX_API_BODY).await else {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                "the LFS request is too large\n",
            )
                .into_response();
        };
        if let Some(answer) = sh
            .cfg
            .served
            .lfs_answer(&full_name, method, path_info, headers, &bytes)
        {
            return answer;
        }
        return (StatusCode::NOT_FOUND, "no such LFS route\n").into_response();
    }
    let max_file_size = sh.lock().git_max_file_size;
    let request = git::BackendRequest {
        repo,
        branch: &sh.cfg.branch,
        max_file_size,
        method,
        path_info,
        query,
        headers,
    };
    git::http_backend(request, body).await
}

/// `owner/name` of a served bare repository, from its path below the
/// project root.
fn repo_full_name_of(repo: &BareRepo) -> Option<String> {
    let relative = repo.path.strip_prefix(&repo.project_root).ok()?;
    let text = relative.to_str()?;
    text.strip_suffix(".git").map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_routes() {
        let r = |p: &str| classify(&Method::GET, p).target();
        assert_eq!(r("/api/cli/sessions/s1"), Route::Session);
        assert_eq!(r("/api/cli/sessions/s1/agent-token"), Route::AgentToken);
        assert_eq!(r("/api/cli/sessions/s1/boot-status"), Route::BootStatus);
        assert_eq!(r("/api/cli/sessions/s1/env-bundle"), Route::EnvBundle);
        assert_eq!(r("/api/cli/sessions/s1/repo-token"), Route::RepoToken);
        assert_eq!(r("/api/cli/workbench-runs/run-1"), Route::RunStarted);
        assert_eq!(r("/api/cli/workbench-runs/run-1/events"), Route::Events);
        assert_eq!(
            r("/api/cli/workbench-runs/run-1/events/cursor"),
            Route::Cursor
        );
        assert_eq!(r("/api/cli/workbench-runs/run-1/finish"), Route::Finish);
        assert_eq!(r("/api/cli/sessions/s1/agent-state"), Route::AgentStateLoad);
        assert_eq!(
            classify(&Method::POST, "/api/cli/sessions/s1/agent-state").target(),
            Route::AgentStateSave
        );
        assert_eq!(r("/git/acme/app.git/info/refs"), Target::Git);
        assert_eq!(r("/dev/state"), Target::Dev);
        assert_eq!(r("/api/cli/sessions"), Target::Unknown);
        assert_eq!(r("/"), Target::Unknown);
    }

    fn http() -> reqwest::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
    }

    /// A path no route matches answers `404` with a JSON error that names
    /// the method and the path (without its query, which may carry a
    /// credential) and where the routes are listed, not a bare "no such
    /// route"; under `dev/`, the dev API's routes are named.
    #[tokio::test]
    async fn an_unknown_path_is_a_404_naming_it() {
        let c = super::super::Coordinator::start(Default::default())
            .await
            .unwrap();
        let http = http();
        let cases = [
            (
                "api/cli/sessions",
                "GET /api/cli/sessions",
                "PROTOCOL.md section 2",
            ),
            (
                "api/cli/workbench-runs/run-1/nope?token=abc",
                "GET /api/cli/workbench-runs/run-1/nope",
                "PROTOCOL.md section 2",
            ),
            (
                "dev/nope",
                "GET /dev/nope",
                "turns, interrupt, end, faults, git, requests, state, setup",
            ),
        ];
        for (path, named, hint) in cases {
            let resp = http
                .get(format!("{}{path}", c.base_url()))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), StatusCode::NOT_FOUND, "{path}");
            assert_eq!(
                resp.headers()[header::CONTENT_TYPE],
                "application/json",
                "{path}"
            );
            let body: Value = resp.json().await.unwrap();
            let error = body["error"].as_str().unwrap_or_default();
            assert!(error.contains(named), "{path}: {body}");
            assert!(error.contains(hint), "{path}: {body}");
            assert!(!error.contains("abc"), "the query is not echoed: {body}");
        }
    }

    /// Every route of the table is served: a request of its method to its
    /// path (the coordinator's session, run `run-1`, no credential) is
    /// recorded as that route and answered by its handler (here `401`, the
    /// credential check every row has), never the unknown-route `404`. So
    /// is every route of the dev API.
    #[tokio::test]
    async fn every_route_of_the_tables_is_served() {
        let c = super::super::Coordinator::start(Default::default())
            .await
            .unwrap();
        let http = http();
        for route in Route::all() {
            let spec = route.spec();
            let value = match spec.param {
                Param::SessionId => c.session_id(),
                Param::RunId => "run-1".to_string(),
            };
            let method = Method::from_bytes(spec.method.as_str().as_bytes()).unwrap();
            let url = format!("{}{}", c.base_url(), route.path(&value));
            let resp = http.request(method, &url).send().await.unwrap();
            let status = resp.status();
            let body: Value = resp.json().await.unwrap();
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{}: {body}", spec.name);
            let recorded = c.requests().pop().unwrap();
            assert_eq!(recorded.route, Target::Route(route), "{}", spec.name);
            assert_eq!(recorded.route.name(), spec.name);
        }
        for dev in dev::DEV_TABLE {
            for method in dev.methods {
                let method = Method::from_bytes(method.as_bytes()).unwrap();
                let url = format!("{}dev/{}", c.base_url(), dev.name);
                // Bodies that each POST accepts; the answer may still be a
                // refusal of the state (409), never a 404 or 405.
                let body = match dev.name {
                    "turns" => json!({"body": "x"}),
                    "faults" => json!({"route": "session", "status": 503}),
                    "git" => json!({"maxFileSize": null}),
                    "lfs" => json!({"content": "x"}),
                    "repos" => json!({"fullName": "acme/lib", "source": c.bare_repo()}),
                    _ => json!({}),
                };
                let resp = http
                    .request(method.clone(), &url)
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                let status = resp.status();
                assert!(
                    status == StatusCode::OK || status == StatusCode::CONFLICT,
                    "{method} dev/{}: {status}",
                    dev.name
                );
            }
        }
    }

    #[test]
    fn authorization_is_masked_in_the_record() {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer abcdef123456"),
        );
        h.insert(
            "x-orizu-hosted-poll",
            HeaderValue::from_static("during-turn"),
        );
        let rec = recorded_headers(&h);
        assert_eq!(rec["authorization"], "Bearer ***");
        assert_eq!(rec["x-orizu-hosted-poll"], "during-turn");
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("opaque"));
        assert_eq!(recorded_headers(&h)["authorization"], "***");
    }
}
