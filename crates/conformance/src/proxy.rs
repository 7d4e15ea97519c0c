//! The recording proxy of `hosted-boot-conformance`: on loopback between
//! the runner (and its credential helper) and the platform's coordinator. It
//! forwards every request of PROTOCOL.md section 2 unchanged, never follows
//! a redirect (section 2), records each answer (status, whether it matched
//! the document, its size against the route's cap), and on the first
//! events batch the coordinator accepts, resends that batch itself and
//! reads the cursor (2.6: a resend at or below the cursor is ignored).
//! Credentials pass through in headers only; nothing is recorded of them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::watch;
use url::Url;

use super::openapi::Document;
use crate::wire::routes::{Route, match_request};

/// Where the proxy forwards: the URLs of the sandbox's environment.
#[derive(Clone, Debug)]
pub struct Upstream {
    /// `ORIZU_API_BASE_URL`.
    pub api_base: Url,
    /// `ORIZU_AGENT_TOKEN_URL`.
    pub agent_token: Url,
    /// `ORIZU_BOOT_STATUS_URL` (or its default).
    pub boot_status: Url,
}

/// The proxy's paths for the two injected URLs, and the prefix of the API
/// base.
pub const AGENT_TOKEN_PATH: &str = "/agent-token";
/// See [`AGENT_TOKEN_PATH`].
pub const BOOT_STATUS_PATH: &str = "/boot-status";
/// See [`AGENT_TOKEN_PATH`].
pub const API_PREFIX: &str = "/base/";

/// One answer the coordinator gave, as recorded.
#[derive(Clone, Debug)]
pub struct Exchange {
    /// The route.
    pub route: Route,
    /// The route's parameter (session or run id).
    pub param: String,
    /// The request body, parsed (`Null` when none or not JSON).
    pub request: Value,
    /// The status, or `None` when no HTTP answer came (the error's kind).
    pub status: Option<u16>,
    /// The transport error, when no answer came (no URL, no secret).
    pub transport_error: Option<String>,
    /// Whether a `Location` header came with it.
    pub location: bool,
    /// The 2xx answer's body, parsed (`Null` otherwise).
    pub answer: Value,
    /// Why the answer does not match the document (`None`: it does, or it
    /// is not a 2xx).
    pub mismatch: Option<String>,
    /// Whether conformance itself sent it (the resend, the cursor read).
    pub by_conformance: bool,
}

/// What the proxy learned, read by the command once the runner is gone.
#[derive(Debug, Default)]
pub struct Record {
    /// Every exchange, in order of answer.
    pub exchanges: Vec<Exchange>,
    /// The resend check: `Ok` or expected-vs-got.
    pub resend: Option<Result<(), String>>,
    /// The cursor check after the resend.
    pub cursor: Option<Result<(), String>>,
    /// A backwards `acceptedThrough`, if one came.
    pub backwards: Option<String>,
    /// Whether a session answer offered the agent state (2.4
    /// `agentState`), and conformance read it once (2.7).
    pub agent_state_offered: bool,
    highest: HashMap<String, u64>,
}

/// The boot statuses the runner posted that the command waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Milestone {
    /// Nothing yet.
    None,
    /// `ready` was acknowledged: the session had no run to take.
    Ready,
    /// `turn_completed` was acknowledged: the turn is sealed.
    TurnCompleted,
    /// After `turn_completed`, a session read of the wait between turns
    /// (4.2) was answered: a stop now is the between-turns stop of 4.4.
    BetweenTurns,
}

struct Shared {
    upstream: Upstream,
    http: reqwest::Client,
    doc: Document,
    record: Mutex<Record>,
    milestone: watch::Sender<Milestone>,
    /// Created once an accepted batch holds the agent's last burst event
    /// (`crate::BURST_ACCEPTED_VAR`).
    burst_accepted: PathBuf,
}

/// A running proxy.
pub struct Proxy {
    shared: Arc<Shared>,
    base: Url,
    task: tokio::task::JoinHandle<()>,
    /// Fires with each milestone.
    pub milestones: watch::Receiver<Milestone>,
}

impl Proxy {
    /// Listens on `127.0.0.1:0` and serves.
    ///
    /// Errors: the listener cannot be bound.
    pub async fn start(
        upstream: Upstream,
        http: reqwest::Client,
        doc: Document,
        burst_accepted: PathBuf,
    ) -> anyhow::Result<Proxy> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (tx, rx) = watch::channel(Milestone::None);
        let shared = Arc::new(Shared {
            upstream,
            http,
            doc,
            record: Mutex::new(Record::default()),
            milestone: tx,
            burst_accepted,
        });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let base = Url::parse(&format!("http://{addr}/"))?;
        Ok(Proxy {
            shared,
            base,
            task,
            milestones: rx,
        })
    }

    /// The URL the runner gets for `path` (one of the constants above).
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base.as_str().trim_end_matches('/'), path)
    }

    /// Stops serving and hands over what was recorded.
    pub fn finish(self) -> Record {
        self.task.abort();
        std::mem::take(&mut *crate::locks::lock(&self.shared.record))
    }
}

/// Headers of a request the coordinator needs.
const REQUEST_HEADERS: &[HeaderName] =
    &[header::AUTHORIZATION, header::CONTENT_TYPE, header::ACCEPT];
/// Headers of an answer the runner reads.
const ANSWER_HEADERS: &[HeaderName] = &[
    header::CONTENT_TYPE,
    header::RETRY_AFTER,
    header::DATE,
    header::LOCATION,
    header::WWW_AUTHENTICATE,
];

async fn handle(State(sh): State<Arc<Shared>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let (route, param, target) = if path == AGENT_TOKEN_PATH {
        (
            Route::AgentToken,
            String::new(),
            Some(sh.upstream.agent_token.clone()),
        )
    } else if path == BOOT_STATUS_PATH {
        (
            Route::BootStatus,
            String::new(),
            Some(sh.upstream.boot_status.clone()),
        )
    } else if let Some(rest) = path.strip_prefix(API_PREFIX) {
        match match_request(req.method().as_str(), rest) {
            Some((route, param)) => (route, param, sh.upstream.api_base.join(rest).ok()),
            None => {
                return (
                    StatusCode::NOT_FOUND,
                    "not a route of PROTOCOL.md section 2",
                )
                    .into_response();
            }
        }
    } else {
        return (
            StatusCode::NOT_FOUND,
            "not a route of PROTOCOL.md section 2",
        )
            .into_response();
    };
    let Some(target) = target else {
        return (
            StatusCode::BAD_GATEWAY,
            "cannot build the coordinator's URL",
        )
            .into_response();
    };
    let method = req.method().clone();
    let mut headers = HeaderMap::new();
    for name in REQUEST_HEADERS {
        if let Some(v) = req.headers().get(name) {
            headers.insert(name.clone(), v.clone());
        }
    }
    if let Some(v) = req.headers().get(crate::wire::DURING_TURN_HEADER.0) {
        headers.insert(
            HeaderName::from_static(crate::wire::DURING_TURN_HEADER.0),
            v.clone(),
        );
    }
    let body = match axum::body::to_bytes(req.into_body(), 64 * 1024 * 1024).await {
        Ok(b) => b,
        Err(_) => return (StatusCode::PAYLOAD_TOO_LARGE, "request too large").into_response(),
    };
    let (exchange, answer) = forward(
        &sh,
        route,
        param,
        method,
        target,
        headers.clone(),
        body.clone(),
        false,
    )
    .await;
    after_answer(&sh, &exchange, &headers, &body).await;
    crate::locks::lock(&sh.record).exchanges.push(exchange);
    answer
}

/// Sends one request to the coordinator and records its answer.
#[allow(
    clippy::too_many_arguments,
    reason = "one request's parts, passed once"
)]
async fn forward(
    sh: &Shared,
    route: Route,
    param: String,
    method: axum::http::Method,
    target: Url,
    headers: HeaderMap,
    body: Bytes,
    by_conformance: bool,
) -> (Exchange, Response) {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut ex = Exchange {
        route,
        param,
        request,
        status: None,
        transport_error: None,
        location: false,
        answer: Value::Null,
        mismatch: None,
        by_conformance,
    };
    let sent = sh
        .http
        .request(method, target)
        .headers(headers)
        .body(body)
        .send()
        .await;
    let resp = match sent {
        Ok(r) => r,
        Err(e) => {
            // reqwest's text names the URL; keep only its kind.
            let kind = if e.is_timeout() {
                "timeout"
            } else if e.is_connect() {
                "connection failed"
            } else {
                "no HTTP answer"
            };
            ex.transport_error = Some(kind.to_string());
            return (
                ex,
                (StatusCode::BAD_GATEWAY, kind.to_string()).into_response(),
            );
        }
    };
    let status = resp.status().as_u16();
    ex.status = Some(status);
    ex.location = resp.headers().contains_key(header::LOCATION);
    let mut out_headers = HeaderMap::new();
    for name in ANSWER_HEADERS {
        if let Some(v) = resp.headers().get(name) {
            out_headers.insert(name.clone(), v.clone());
        }
    }
    let content_type = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let cap = route.spec().cap;
    let (bytes, over) = read_capped(resp, cap).await;
    if (200..300).contains(&status) {
        ex.answer = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        ex.mismatch = check_answer(&sh.doc, route, status, &content_type, &bytes, over, cap);
    }
    let mut answer = Response::new(Body::from(bytes));
    *answer.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    *answer.headers_mut() = out_headers;
    (ex, answer)
}

/// Reads at most `cap + 1` bytes: whether the body went over its cap.
async fn read_capped(resp: reqwest::Response, cap: usize) -> (Bytes, bool) {
    let mut out = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else { break };
        out.extend_from_slice(&chunk);
        if out.len() > cap {
            return (Bytes::from(out), true);
        }
    }
    (Bytes::from(out), false)
}

/// Why a 2xx answer does not match the document, if it does not.
fn check_answer(
    doc: &Document,
    route: Route,
    status: u16,
    content_type: &str,
    bytes: &[u8],
    over: bool,
    cap: usize,
) -> Option<String> {
    if over {
        return Some(format!(
            "an answer within {cap} bytes (section 2), got more"
        ));
    }
    let schema = doc.response_schema(route, status)?;
    // An ack's body is not read (2.2, 2.6): an empty one is fine.
    let ack = matches!(route, Route::BootStatus | Route::RunStarted | Route::Finish);
    if ack && bytes.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    if !content_type.starts_with("application/json") {
        return Some(format!(
            "Content-Type application/json, got {}",
            if content_type.is_empty() {
                "none"
            } else {
                content_type
            }
        ));
    }
    let value: Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(_) => return Some("a JSON body, got one that does not parse".into()),
    };
    doc.validate(schema, &value).err().map(|m| m.0)
}

/// What the answer means beyond its own route: milestones, the
/// `acceptedThrough` order, and the resend of the first accepted batch.
// long: one branch per route whose answers mean more than themselves
// (boot status milestones, the events cursor order, the resend), over the
// same exchange and record.
async fn after_answer(sh: &Shared, ex: &Exchange, headers: &HeaderMap, body: &Bytes) {
    let ok = ex.status.is_some_and(|s| (200..300).contains(&s));
    if ex.route == Route::BootStatus && ok {
        match ex.request.get("status").and_then(Value::as_str) {
            Some("ready") => {
                let _ = sh.milestone.send(Milestone::Ready);
            }
            Some("turn_completed") => {
                let _ = sh.milestone.send(Milestone::TurnCompleted);
            }
            _ => {}
        }
    }
    let watch = headers.contains_key(crate::wire::DURING_TURN_HEADER.0);
    if ex.route == Route::Session
        && ok
        && !watch
        && *sh.milestone.borrow() == Milestone::TurnCompleted
    {
        let _ = sh.milestone.send(Milestone::BetweenTurns);
    }
    if ex.route == Route::Session && ok {
        read_agent_state_once(sh, ex, headers).await;
    }
    if !ok || !matches!(ex.route, Route::Events | Route::Cursor) {
        return;
    }
    let Some(n) = ex.answer.get("acceptedThrough").and_then(Value::as_u64) else {
        return;
    };
    note_accepted(sh, &ex.param, n);
    let last_seq = ex
        .request
        .pointer("/events")
        .and_then(Value::as_array)
        .and_then(|e| e.last())
        .and_then(|e| e.get("seq"))
        .and_then(Value::as_u64);
    // The agent's burst accepted whole: its last event in a batch accepted
    // through its last seq.
    let last_of_burst = format!("\"n\":{}", crate::LARGE_BURST);
    if ex.route == Route::Events
        && last_seq.is_some_and(|s| s <= n)
        && ex.request.to_string().contains(&last_of_burst)
    {
        let _ = std::fs::write(&sh.burst_accepted, b"");
    }
    let first_resend = ex.route == Route::Events
        && last_seq.is_some_and(|s| s <= n)
        && crate::locks::lock(&sh.record).resend.is_none();
    if !first_resend {
        return;
    }
    // 2.6: the coordinator ignores events at or below what it accepted.
    let Ok(target) = sh.upstream.api_base.join(&ex.route.path(&ex.param)) else {
        return;
    };
    let (again, _) = forward(
        sh,
        Route::Events,
        ex.param.clone(),
        axum::http::Method::POST,
        target,
        headers.clone(),
        body.clone(),
        true,
    )
    .await;
    let resend = match (
        again.status,
        again.answer.get("acceptedThrough").and_then(Value::as_u64),
    ) {
        (Some(s), Some(m)) if (200..300).contains(&s) && m == n => Ok(()),
        (Some(s), Some(m)) if (200..300).contains(&s) => Err(format!(
            "the same batch again answered 2xx with acceptedThrough {n}, got {s} with acceptedThrough {m}"
        )),
        (Some(s), _) => Err(format!(
            "the same batch again answered 2xx with acceptedThrough {n}, got {s}"
        )),
        (None, _) => Err(format!(
            "the same batch again answered 2xx, got {}",
            again.transport_error.as_deref().unwrap_or("no HTTP answer")
        )),
    };
    if let Some(m) = again.answer.get("acceptedThrough").and_then(Value::as_u64) {
        note_accepted(sh, &ex.param, m);
    }
    let mut cursor_headers = HeaderMap::new();
    if let Some(v) = headers.get(header::AUTHORIZATION) {
        cursor_headers.insert(header::AUTHORIZATION, v.clone());
    }
    let cursor = match sh.upstream.api_base.join(&Route::Cursor.path(&ex.param)) {
        Ok(target) => {
            let (read, _) = forward(
                sh,
                Route::Cursor,
                ex.param.clone(),
                axum::http::Method::GET,
                target,
                cursor_headers,
                Bytes::new(),
                true,
            )
            .await;
            let got = read.answer.get("acceptedThrough").and_then(Value::as_u64);
            if let Some(m) = got {
                note_accepted(sh, &ex.param, m);
            }
            let r = match (read.status, got) {
                (Some(s), Some(m)) if (200..300).contains(&s) && m == n => Ok(()),
                (Some(s), Some(m)) if (200..300).contains(&s) => {
                    Err(format!("the cursor at acceptedThrough {n}, got {m}"))
                }
                (Some(s), _) => Err(format!("the cursor answered 2xx, got {s}")),
                (None, _) => Err("the cursor answered, got no HTTP answer".into()),
            };
            crate::locks::lock(&sh.record).exchanges.push(read);
            r
        }
        Err(_) => Err("the cursor's URL could not be built".into()),
    };
    let mut record = crate::locks::lock(&sh.record);
    record.exchanges.push(again);
    record.resend = Some(resend);
    record.cursor = Some(cursor);
}

/// The first session answer that offers the agent state (2.4
/// `agentState`): conformance loads it once (2.7) with the runner's
/// credential, so that the load's answers are checked whether or not the
/// runner needs one. Nothing is saved: the session's state stays as it was.
async fn read_agent_state_once(sh: &Shared, ex: &Exchange, headers: &HeaderMap) {
    let offered = ex
        .answer
        .pointer("/session/agentState")
        .is_some_and(|v| !v.is_null());
    {
        let mut record = crate::locks::lock(&sh.record);
        if !offered || record.agent_state_offered {
            return;
        }
        record.agent_state_offered = true;
    }
    let mut auth = HeaderMap::new();
    if let Some(v) = headers.get(header::AUTHORIZATION) {
        auth.insert(header::AUTHORIZATION, v.clone());
    }
    let Ok(target) = sh
        .upstream
        .api_base
        .join(&Route::AgentStateLoad.path(&ex.param))
    else {
        return;
    };
    let (read, _) = forward(
        sh,
        Route::AgentStateLoad,
        ex.param.clone(),
        axum::http::Method::GET,
        target,
        auth,
        Bytes::new(),
        true,
    )
    .await;
    crate::locks::lock(&sh.record).exchanges.push(read);
}

/// Records `n` as the run's latest `acceptedThrough`; a lower one than
/// before is a contract break (2.6).
fn note_accepted(sh: &Shared, run: &str, n: u64) {
    let mut record = crate::locks::lock(&sh.record);
    let highest = record.highest.get(run).copied().unwrap_or(0);
    if n < highest && record.backwards.is_none() {
        record.backwards = Some(format!(
            "acceptedThrough of run {run} at least {highest}, got {n}"
        ));
    }
    record.highest.insert(run.to_string(), highest.max(n));
}
