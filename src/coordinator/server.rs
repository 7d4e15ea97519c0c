//! The HTTP side of the coordinator: one handler that records every request,
//! applies injected faults, and dispatches to the routes of PROTOCOL.md
//! section 2, the git smart-HTTP routes and the dev API (section 6).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request, State as AxumState};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use futures_util::StreamExt;
use serde::Deserialize;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::conn::ConnHandle;
use super::git::{self, BareRepo};
use super::state::{ApiError, DevError, Fault, RecordedRequest, Route, Snapshot, State};
use crate::secret::Secret;
use crate::wire::{
    AcceptedThrough, AgentTokenResponse, AnswerToQuestion, BootStatusBody, ClientInfo, Connector,
    EnvBundle, EventsBody, ExpiresAt, FinishBody, RepoTokenRequest, RepoTokenResponse,
    SessionEnvelope,
};

/// Largest API request body read (the git routes stream without a limit).
const MAX_API_BODY: usize = 16 * 1024 * 1024;

/// Immutable settings of a running coordinator.
pub(crate) struct Config {
    pub session_id: String,
    pub workspace_id: String,
    pub repo_full_name: String,
    pub branch: String,
    pub client_info: ClientInfo,
    pub connectors: Vec<(String, String)>,
    pub redact_vars: Vec<String>,
    pub bearer_ttl: Duration,
    pub repo_token_ttl: Duration,
    pub repo_token_expires_at: bool,
    pub boot_secret: Secret,
    /// Required on the dev API when set (non-loopback listen).
    pub dev_token: Option<Secret>,
    pub repo: BareRepo,
}

/// What the handler shares: settings, state, and a signal for waiters.
pub(crate) struct Shared {
    pub cfg: Config,
    pub state: Mutex<State>,
    pub changed: Notify,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
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

/// The router: every request goes through [`handle`].
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(shared)
}

/// A request's target, from the shape of its path alone.
enum Target {
    AgentToken(String),
    BootStatus(String),
    EnvBundle(String),
    Session(String),
    RepoToken(String),
    RunStarted(String),
    Events(String),
    Cursor(String),
    Finish(String),
    /// The path below `/git`, starting with `/`.
    Git(String),
    /// The path below `/dev/`.
    Dev(String),
    Unknown,
}

impl Target {
    fn route(&self) -> Route {
        match self {
            Target::AgentToken(_) => Route::AgentToken,
            Target::BootStatus(_) => Route::BootStatus,
            Target::EnvBundle(_) => Route::EnvBundle,
            Target::Session(_) => Route::Session,
            Target::RepoToken(_) => Route::RepoToken,
            Target::RunStarted(_) => Route::RunStarted,
            Target::Events(_) => Route::Events,
            Target::Cursor(_) => Route::Cursor,
            Target::Finish(_) => Route::Finish,
            Target::Git(_) => Route::Git,
            Target::Dev(_) => Route::Dev,
            Target::Unknown => Route::Unknown,
        }
    }
}

fn classify(path: &str) -> Target {
    if let Some(rest) = path.strip_prefix("/git/") {
        return Target::Git(format!("/{rest}"));
    }
    if let Some(rest) = path.strip_prefix("/dev/") {
        return Target::Dev(rest.to_string());
    }
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let s = |id: &str| id.to_string();
    match segs.as_slice() {
        ["api", "cli", "sessions", sid] => Target::Session(s(sid)),
        ["api", "cli", "sessions", sid, "agent-token"] => Target::AgentToken(s(sid)),
        ["api", "cli", "sessions", sid, "boot-status"] => Target::BootStatus(s(sid)),
        ["api", "cli", "sessions", sid, "env-bundle"] => Target::EnvBundle(s(sid)),
        ["api", "cli", "sessions", sid, "repo-token"] => Target::RepoToken(s(sid)),
        ["api", "cli", "workbench-runs", rid] => Target::RunStarted(s(rid)),
        ["api", "cli", "workbench-runs", rid, "events"] => Target::Events(s(rid)),
        ["api", "cli", "workbench-runs", rid, "events", "cursor"] => Target::Cursor(s(rid)),
        ["api", "cli", "workbench-runs", rid, "finish"] => Target::Finish(s(rid)),
        _ => Target::Unknown,
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

fn ok<T: Serialize>(body: &T) -> Response {
    json_response(StatusCode::OK, body)
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
    resp
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
        let stall = Duration::from_millis(ms);
        stream = Box::pin(futures_util::stream::unfold(
            (stream, 0u64),
            move |(mut stream, n)| async move {
                if n == 1 {
                    tokio::time::sleep(stall).await;
                }
                let item = stream.next().await?;
                Some((item, (stream, n + 1)))
            },
        ));
    }
    Response::from_parts(parts, Body::from_stream(stream))
}

/// The one handler. Records the request (after reading an API body; git
/// bodies are streamed and not recorded), applies a queued fault, dispatches.
async fn handle(
    AxumState(sh): AxumState<Arc<Shared>>,
    ConnectInfo(conn): ConnectInfo<ConnHandle>,
    req: Request,
) -> Response {
    let target = classify(req.uri().path());
    let route = target.route();
    let (parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string());

    let mut too_large = false;
    let (bytes, git_body, body_len) = if route == Route::Git {
        let len = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        (Bytes::new(), Some(body), len)
    } else {
        match axum::body::to_bytes(body, MAX_API_BODY).await {
            Ok(b) => {
                let len = b.len() as u64;
                (b, None, len)
            }
            Err(_) => {
                too_large = true;
                (Bytes::new(), None, 0)
            }
        }
    };

    let (index, fault) = sh.update(|st| {
        let fault = if too_large {
            None
        } else {
            st.take_fault(route)
        };
        st.requests.push(RecordedRequest {
            at_ms: st.elapsed_ms(),
            method: parts.method.to_string(),
            path: path.clone(),
            route,
            headers: recorded_headers(&parts.headers),
            body: if route == Route::Git {
                Value::Null
            } else {
                recorded_body(&bytes)
            },
            body_len,
            response_status: None,
            fault: fault.clone(),
        });
        (st.requests.len() - 1, fault)
    });

    if let Some(ms) = fault.as_ref().and_then(|f| f.delay_ms) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let answer: Option<Response> = if too_large {
        Some(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "request body too large").into_response())
    } else {
        match &fault {
            Some(f) if !f.after && f.reset => None,
            Some(f) if !f.after && f.replaces() => Some(fault_response(f)),
            _ => {
                let normal = dispatch(
                    &sh,
                    target,
                    &parts.method,
                    &parts.uri,
                    &parts.headers,
                    bytes,
                    git_body,
                )
                .await;
                match &fault {
                    Some(f) if f.after && f.reset => None,
                    Some(f) if f.after && f.replaces() => Some(fault_response(f)),
                    _ => Some(normal),
                }
            }
        }
    };

    let status = answer.as_ref().map(|r| r.status().as_u16());
    sh.update(|st| {
        if let Some(r) = st.requests.get_mut(index) {
            r.response_status = status;
        }
    });
    tracing::debug!(
        method = %parts.method,
        path = %parts.uri.path(),
        route = route.as_str(),
        status = ?status,
        "coordinator request"
    );
    match answer {
        Some(resp) => match &fault {
            Some(f) => shaped(resp, f),
            None => resp,
        },
        None => {
            // The connection fails its next write, so this is never sent.
            conn.kill();
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

type Reply = Result<Response, ApiError>;

fn allow(method: &Method, allowed: Method) -> Result<(), ApiError> {
    if *method == allowed {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("use {allowed} on this route"),
        ))
    }
}

fn auth_value<'a>(headers: &'a HeaderMap, scheme: &str) -> Option<&'a str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (s, rest) = v.split_once(' ')?;
    s.eq_ignore_ascii_case(scheme).then(|| rest.trim())
}

fn unauthorized(what: &str) -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        format!("missing or invalid {what}"),
    )
}

fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
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

    fn session_envelope(&self) -> SessionEnvelope {
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
    target: Target,
    method: &Method,
    uri: &axum::http::Uri,
    headers: &HeaderMap,
    body: Bytes,
    git_body: Option<Body>,
) -> Response {
    let reply = match target {
        Target::Git(path_info) => {
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
        Target::Dev(rest) => dev_route(sh, method, &rest, headers, &body),
        Target::Unknown => Err(ApiError::new(StatusCode::NOT_FOUND, "no such route")),
        other => api_route(sh, other, method, headers, &body),
    };
    reply.unwrap_or_else(IntoResponse::into_response)
}

/// The routes of PROTOCOL.md section 2. Order of checks: method (405), auth
/// (401), session or run (404), body (400), state (409).
fn api_route(
    sh: &Shared,
    target: Target,
    method: &Method,
    headers: &HeaderMap,
    body: &[u8],
) -> Reply {
    let cfg = &sh.cfg;
    match target {
        Target::AgentToken(sid) => {
            allow(method, Method::GET)?;
            sh.check_boot_secret(headers)?;
            sh.check_session(&sid)?;
            let (token, expires_at) = sh.update(|st| st.issue_bearer(cfg.bearer_ttl));
            Ok(ok(&AgentTokenResponse {
                token: token.into(),
                expires_at: Some(ExpiresAt::Rfc3339(expires_at)),
            }))
        }
        Target::BootStatus(sid) => {
            allow(method, Method::POST)?;
            sh.check_boot_secret(headers)?;
            sh.check_session(&sid)?;
            let status: BootStatusBody = parse(body)?;
            sh.update(|st| st.statuses.push(status));
            Ok(ok(&json!({"ok": true})))
        }
        Target::EnvBundle(sid) => {
            allow(method, Method::GET)?;
            sh.check_bearer(headers)?;
            sh.check_session(&sid)?;
            Ok(ok(&EnvBundle {
                connectors: cfg
                    .connectors
                    .iter()
                    .map(|(k, v)| Connector {
                        env_var: k.clone(),
                        value: v.as_str().into(),
                    })
                    .collect(),
                redact_vars: cfg.redact_vars.clone(),
            }))
        }
        Target::Session(sid) => {
            allow(method, Method::GET)?;
            sh.check_bearer(headers)?;
            sh.check_session(&sid)?;
            Ok(ok(&sh.session_envelope()))
        }
        Target::RepoToken(sid) => {
            allow(method, Method::POST)?;
            sh.check_bearer(headers)?;
            sh.check_session(&sid)?;
            let req: RepoTokenRequest = parse(body)?;
            let (token, expires_at) =
                sh.update(|st| st.issue_repo_token(req.access, cfg.repo_token_ttl));
            Ok(ok(&RepoTokenResponse {
                token: token.into(),
                expires_at: cfg
                    .repo_token_expires_at
                    .then_some(ExpiresAt::Rfc3339(expires_at)),
                repo_full_name: Some(cfg.repo_full_name.clone()),
                artifacts_remote: None,
            }))
        }
        Target::RunStarted(rid) => {
            allow(method, Method::POST)?;
            sh.check_bearer(headers)?;
            sh.update(|st| st.run_started(&rid))?;
            Ok(ok(&json!({"ok": true})))
        }
        Target::Events(rid) => {
            allow(method, Method::POST)?;
            sh.check_bearer(headers)?;
            if sh.lock().run(&rid).is_none() {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("unknown run {rid:?}"),
                ));
            }
            let events: EventsBody = parse(body)?;
            let n = sh.update(|st| st.add_events(&rid, events.events))?;
            Ok(ok(&AcceptedThrough {
                accepted_through: n,
            }))
        }
        Target::Cursor(rid) => {
            allow(method, Method::GET)?;
            sh.check_bearer(headers)?;
            let n = sh
                .lock()
                .run(&rid)
                .map(|r| r.accepted_through())
                .ok_or_else(|| {
                    ApiError::new(StatusCode::NOT_FOUND, format!("unknown run {rid:?}"))
                })?;
            Ok(ok(&AcceptedThrough {
                accepted_through: n,
            }))
        }
        Target::Finish(rid) => {
            allow(method, Method::POST)?;
            sh.check_bearer(headers)?;
            if sh.lock().run(&rid).is_none() {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("unknown run {rid:?}"),
                ));
            }
            let fin: FinishBody = parse(body)?;
            sh.update(|st| st.finish(&rid, fin))?;
            Ok(ok(&json!({"ok": true})))
        }
        Target::Git(_) | Target::Dev(_) | Target::Unknown => {
            Err(ApiError::new(StatusCode::NOT_FOUND, "no such route"))
        }
    }
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
    if !path_info.starts_with(&prefix) || path_info.split('/').any(|s| s == "..") {
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
    if git::is_push(path_info, query) && access != crate::wire::Access::Write {
        return (StatusCode::FORBIDDEN, "this repo token is read-only\n").into_response();
    }
    let max_file_size = sh.lock().git_max_file_size;
    let request = git::BackendRequest {
        repo: &sh.cfg.repo,
        branch: &sh.cfg.branch,
        max_file_size,
        method,
        path_info,
        query,
        headers,
    };
    git::http_backend(request, body).await
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TurnRequest {
    body: String,
    #[serde(default)]
    answer_to_question: Option<AnswerToQuestion>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GitSettings {
    /// Bytes, or null for no limit.
    max_file_size: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct InterruptRequest {
    #[serde(default)]
    run_id: Option<String>,
}

fn dev_error(e: DevError) -> ApiError {
    let status = match e {
        DevError::UnknownRun(_) => StatusCode::NOT_FOUND,
        DevError::NoRunningRun | DevError::RunSealed(_) => StatusCode::CONFLICT,
        DevError::InvalidFault(_) => StatusCode::BAD_REQUEST,
        DevError::Timeout { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    };
    ApiError::new(status, e.to_string())
}

/// The dev API (PROTOCOL.md section 6).
fn dev_route(sh: &Shared, method: &Method, rest: &str, headers: &HeaderMap, body: &[u8]) -> Reply {
    if let Some(token) = &sh.cfg.dev_token {
        if auth_value(headers, "Bearer") != Some(token.expose()) {
            return Err(unauthorized("dev token"));
        }
    }
    match rest {
        "turns" => {
            allow(method, Method::POST)?;
            let req: TurnRequest = parse(body)?;
            let run_id = sh.update(|st| st.queue_turn(req.body, req.answer_to_question));
            Ok(ok(&json!({"runId": run_id})))
        }
        "interrupt" => {
            allow(method, Method::POST)?;
            let req: InterruptRequest = if body.is_empty() {
                InterruptRequest::default()
            } else {
                parse(body)?
            };
            let run_id = sh
                .update(|st| st.interrupt(req.run_id.as_deref()))
                .map_err(dev_error)?;
            Ok(ok(&json!({"runId": run_id})))
        }
        "end" => {
            allow(method, Method::POST)?;
            sh.update(|st| st.status = "ended".into());
            Ok(ok(&json!({"status": "ended"})))
        }
        "faults" => match *method {
            Method::POST => {
                let fault: Fault = parse(body)?;
                sh.add_fault(fault).map_err(dev_error)?;
                Ok(ok(&json!({"ok": true})))
            }
            Method::DELETE => {
                sh.update(|st| st.faults.clear());
                Ok(ok(&json!({"ok": true})))
            }
            Method::GET => Ok(ok(&sh.lock().faults)),
            _ => Err(ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "use GET, POST or DELETE",
            )),
        },
        "git" => match *method {
            Method::POST => {
                let settings: GitSettings = parse(body)?;
                sh.update(|st| st.git_max_file_size = settings.max_file_size);
                Ok(ok(&json!({"maxFileSize": settings.max_file_size})))
            }
            Method::GET => Ok(ok(&json!({"maxFileSize": sh.lock().git_max_file_size}))),
            _ => Err(ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "use GET or POST",
            )),
        },
        "requests" => {
            allow(method, Method::GET)?;
            Ok(ok(&sh.lock().requests))
        }
        "state" => {
            allow(method, Method::GET)?;
            Ok(ok(&sh.snapshot()))
        }
        _ => Err(ApiError::new(StatusCode::NOT_FOUND, "no such dev route")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_routes() {
        let r = |p: &str| classify(p).route();
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
        assert_eq!(r("/git/acme/app.git/info/refs"), Route::Git);
        assert_eq!(r("/dev/state"), Route::Dev);
        assert_eq!(r("/api/cli/sessions"), Route::Unknown);
        assert_eq!(r("/"), Route::Unknown);
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
