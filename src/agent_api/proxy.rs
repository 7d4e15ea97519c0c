//! The agent's API proxy (PROTOCOL.md section 3, "The agent's API"): an
//! HTTP server on `127.0.0.1` (ephemeral port, one per boot) that the
//! agent's `ORIZU_API_BASE_URL` points at during a turn.
//!
//! Each request must carry the turn's proxy token (`Authorization: Bearer`,
//! the contents of `ORIZU_TOKEN_FILE`); its method and path must be a route
//! of the table (`wire::routes`) for this boot's session (or, for a run
//! route, the turn's run) that the allowlist holds. Then the request goes
//! to the coordinator with the runner's current bearer instead of the proxy
//! token and only the contract's request headers, and the answer streams
//! back: status, the contract's answer headers (`Retry-After` among them),
//! the body up to the route's cap. Anything else is answered by the proxy
//! itself with a JSON error (`{"error", "route", "refusal"}`) and logged;
//! nothing of it reaches the coordinator.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use futures_util::StreamExt;
use reqwest::Url;
use serde_json::json;
use tokio::task::JoinHandle;

use super::{Allowlist, NEVER_FORWARDED, peer};
use crate::client::{Api, Policy};
use crate::process::tree::Runner;
use crate::redact::{Redactor, SecretKind};
use crate::secret::Secret;
use crate::wire::routes::{self, Method, Param, Route};

/// Bytes of OS randomness in a proxy token (hex-encoded: 64 characters).
pub const TOKEN_BYTES: usize = 32;

/// Largest request body the proxy reads from the agent (an events batch is
/// at most 1 MiB of event JSON, a single larger event alone, 2.6): 4 MiB.
/// A larger one is answered `413` without a request to the coordinator.
pub const REQUEST_CAP: usize = 4 * 1024 * 1024;

/// A connection to the proxy that moves no byte for this many per-attempt
/// timeouts (60 s) is closed; at most
/// [`MAX_CONNECTIONS`](super::listener::MAX_CONNECTIONS) are served at once
/// (issue 32).
pub const IDLE_TIMEOUTS: u32 = 6;

/// Why the proxy answered a request itself (`refusal` in its error body).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No proxy token, a wrong one, or one of a turn that ended (`401`).
    Unauthenticated,
    /// The method and path are no route of the table (`403`).
    UnknownRoute,
    /// A route the proxy never forwards ([`NEVER_FORWARDED`], `403`).
    NeverForwarded,
    /// A route the allowlist does not hold (`403`).
    NotAllowed,
    /// A session route for another session than this boot's (`403`).
    OtherSession,
    /// A run route for another run than the turn's (`403`).
    OtherRun,
    /// The connection does not come from a process of the turn the token
    /// was made for (`403`).
    OutsideTurn,
    /// A request body over [`REQUEST_CAP`] (`413`).
    TooLarge,
    /// The coordinator could not be reached, or answered over the route's
    /// cap (`502`).
    Upstream,
}

impl Refusal {
    /// The `refusal` member of the error body.
    pub const fn as_str(self) -> &'static str {
        match self {
            Refusal::Unauthenticated => "unauthenticated",
            Refusal::UnknownRoute => "unknown_route",
            Refusal::NeverForwarded => "never_forwarded",
            Refusal::NotAllowed => "not_allowed",
            Refusal::OtherSession => "other_session",
            Refusal::OtherRun => "other_run",
            Refusal::OutsideTurn => "outside_turn",
            Refusal::TooLarge => "too_large",
            Refusal::Upstream => "upstream_failed",
        }
    }

    /// The status the proxy answers with.
    pub const fn status(self) -> StatusCode {
        match self {
            Refusal::Unauthenticated => StatusCode::UNAUTHORIZED,
            Refusal::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::Upstream => StatusCode::BAD_GATEWAY,
            _ => StatusCode::FORBIDDEN,
        }
    }
}

/// The turn a proxy token was issued for.
struct Grant {
    token: Secret,
    run_id: String,
    /// The client sockets found held by a process of the turn: a kept-alive
    /// connection is looked up once.
    peers: BTreeSet<u64>,
}

/// What the server's handler shares.
struct Shared {
    api: Arc<Api>,
    http: reqwest::Client,
    upstream: Url,
    session_id: String,
    allow: Allowlist,
    redactor: Redactor,
    grant: Mutex<Option<Grant>>,
    /// The proxy's own address: the remote end of its clients' sockets.
    address: SocketAddr,
    runner: Runner,
}

/// The running proxy. Dropping it stops the server.
pub struct ApiProxy {
    base_url: Url,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

/// Why the proxy could not start or issue a token.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// Binding `127.0.0.1:0` failed.
    #[error("cannot start the agent API proxy on 127.0.0.1: {0}")]
    Bind(std::io::Error),
    /// The OS random number generator failed.
    #[error("cannot draw a proxy token from the OS random number generator: {0}")]
    Random(std::io::Error),
}

impl ApiProxy {
    /// Binds `127.0.0.1` on an ephemeral port and serves: requests go to
    /// `upstream` (`ORIZU_API_BASE_URL`, with its trailing slash) through
    /// `http`, with the current bearer of `api`, for session `session_id`
    /// and the routes of `allow`. No token is valid until
    /// [`ApiProxy::issue`].
    ///
    /// Errors: [`ProxyError::Bind`]. Must be called within the runtime.
    pub fn start(
        api: Arc<Api>,
        http: reqwest::Client,
        upstream: Url,
        session_id: String,
        allow: Allowlist,
    ) -> Result<ApiProxy, ProxyError> {
        let std_listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(ProxyError::Bind)?;
        let addr: SocketAddr = std_listener.local_addr().map_err(ProxyError::Bind)?;
        let listener = tokio::net::TcpListener::from_std(std_listener).map_err(ProxyError::Bind)?;
        let base_url = Url::parse(&format!("http://{addr}/")).map_err(|e| {
            ProxyError::Bind(std::io::Error::other(format!("no URL for {addr}: {e}")))
        })?;
        let redactor = api.redactor().clone();
        // Longer than any request is held (the proxy's own call is bounded
        // by the per-attempt timeout): only a connection that does nothing
        // is closed.
        let idle = api.timings().request_timeout * IDLE_TIMEOUTS;
        let listener = super::listener::Capped::new(listener, idle);
        let shared = Arc::new(Shared {
            api,
            http,
            upstream,
            session_id,
            allow,
            redactor,
            grant: Mutex::new(None),
            address: addr,
            runner: Runner::current(),
        });
        let app = Router::new()
            .fallback(handle)
            .with_state(shared.clone())
            .into_make_service_with_connect_info::<super::listener::Client>();
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "the agent API proxy stopped");
            }
        });
        let names: Vec<&str> = shared.allow.routes().iter().map(|r| r.name()).collect();
        tracing::info!(address = %addr, allowed = %names.join(", "), "agent API proxy listening");
        Ok(ApiProxy {
            base_url,
            shared,
            task,
        })
    }

    /// `http://127.0.0.1:<port>/`: the agent's `ORIZU_API_BASE_URL`.
    pub fn base_url(&self) -> &Url {
        &self.base_url
    }

    /// Issues the proxy token of the turn of run `run_id`: [`TOKEN_BYTES`]
    /// of OS randomness, hex, added to the redactor before it is returned.
    /// It replaces any earlier token (which stops working at once) and is
    /// valid until [`ApiProxy::revoke`]. The turn writes it to the bearer
    /// file.
    ///
    /// Errors: [`ProxyError::Random`]; no token is valid then.
    pub fn issue(&self, run_id: &str) -> Result<Secret, ProxyError> {
        self.revoke();
        let token = random_token().map_err(ProxyError::Random)?;
        self.shared.redactor.add(&token, SecretKind::Credential);
        *crate::concurrency::lock(&self.shared.grant) = Some(Grant {
            token: token.clone(),
            run_id: run_id.to_string(),
            peers: BTreeSet::new(),
        });
        Ok(token)
    }

    /// Revokes the turn's token: from now on every request is refused
    /// `401` until the next [`ApiProxy::issue`]. Idempotent.
    pub fn revoke(&self) {
        crate::concurrency::lock(&self.shared.grant).take();
    }
}

impl Drop for ApiProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// [`TOKEN_BYTES`] from `getrandom(2)`, hex.
fn random_token() -> std::io::Result<Secret> {
    let mut bytes = zeroize::Zeroizing::new([0u8; TOKEN_BYTES]);
    let mut filled = 0;
    while filled < TOKEN_BYTES {
        let rest = bytes.get_mut(filled..).unwrap_or_default();
        match rustix::rand::getrandom(rest, rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut hex = String::with_capacity(TOKEN_BYTES * 2);
    for b in bytes.iter() {
        hex.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        hex.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
    }
    Ok(Secret::new(hex))
}

/// Compares without an early exit on the first differing byte, so the time
/// a refusal takes says nothing about how much of a guess was right.
fn same_token(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// The proxy's own answer: `{"error": message, "route": name | null,
/// "refusal": code}`, logged.
fn refuse(refusal: Refusal, route: Option<Route>, method: &str, path: &str, why: &str) -> Response {
    let route_name = route.map(Route::name);
    tracing::warn!(
        method,
        path = %crate::text::head(path, 200),
        route = route_name.unwrap_or("none"),
        refusal = refusal.as_str(),
        "agent API proxy refused a request: {why}"
    );
    let body = json!({
        "error": format!("the agent API proxy refuses this request: {why}"),
        "route": route_name,
        "refusal": refusal.as_str(),
    });
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = refusal.status();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The request headers the proxy forwards to the coordinator, on every
/// route: those the contract uses (PROTOCOL.md 2, 2.4's long-poll, trace
/// context). Every other header stays with the proxy (issue 32): an
/// `X-Original-URL`, `X-HTTP-Method-Override`, `X-Rewrite-URL`,
/// `X-Forwarded-Host`, `Forwarded` or `X-Forwarded-Prefix` re-routed an
/// allowed session read, behind middleware that honours them, to the env
/// bundle or a repo token, with the runner's bearer.
const REQUEST_HEADERS: &[&str] = &[
    "content-type",
    "accept",
    "prefer",
    "if-none-match",
    "traceparent",
    "tracestate",
];

/// The answer headers the proxy passes back to the agent.
const ANSWER_HEADERS: &[&str] = &["content-type", "etag", "preference-applied", "retry-after"];

/// The headers of `headers` that `allowed` names (every value of each).
fn only(headers: &HeaderMap, allowed: &[&str]) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in headers {
        if allowed.contains(&name.as_str()) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

/// Checks a request; `Ok` with the route and its parameter, or the refusal.
fn check(
    shared: &Shared,
    request: &Request,
) -> Result<(Route, String), (Refusal, Option<Route>, String)> {
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.split_once(' ')
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        })
        .map(|(_, t)| t.trim());
    let run_id = {
        let grant = crate::concurrency::lock(&shared.grant);
        match (grant.as_ref(), token) {
            (Some(g), Some(t)) if same_token(t.as_bytes(), g.token.expose().as_bytes()) => {
                g.run_id.clone()
            }
            (None, _) => {
                return Err((
                    Refusal::Unauthenticated,
                    None,
                    "no turn is running: a proxy token is valid only during its turn".into(),
                ));
            }
            _ => {
                return Err((
                    Refusal::Unauthenticated,
                    None,
                    "no valid proxy token (send the contents of ORIZU_TOKEN_FILE as `Authorization: Bearer`; a token of an earlier turn is refused)".into(),
                ));
            }
        }
    };
    let path = request.uri().path();
    let Some((route, value)) = routes::match_request(request.method().as_str(), path) else {
        return Err((
            Refusal::UnknownRoute,
            None,
            "the path is no route of the coordinator contract".into(),
        ));
    };
    let spec = route.spec();
    if request.method().as_str() != spec.method.as_str() {
        return Err((
            Refusal::UnknownRoute,
            Some(route),
            format!(
                "{} takes {}, not {}",
                spec.name,
                spec.method.as_str(),
                request.method()
            ),
        ));
    }
    if NEVER_FORWARDED.contains(&route) {
        return Err((
            Refusal::NeverForwarded,
            Some(route),
            format!(
                "{} is never forwarded: it mints or reads credentials, or speaks for the runner",
                spec.name
            ),
        ));
    }
    if !shared.allow.allows(route) {
        return Err((
            Refusal::NotAllowed,
            Some(route),
            format!("{} is not in the allowlist (--agent-api-allow)", spec.name),
        ));
    }
    match spec.param {
        Param::SessionId if value != shared.session_id => Err((
            Refusal::OtherSession,
            Some(route),
            "only this sandbox's session (ORIZU_SESSION_ID) is served".into(),
        )),
        Param::RunId if value != run_id => Err((
            Refusal::OtherRun,
            Some(route),
            "only the current turn's run (ORIZU_RUN_ID) is served".into(),
        )),
        _ => Ok((route, value)),
    }
}

/// Checks that `client` (the connection's other end) is a socket held by a
/// process of the turn whose token the request carried (issue 32): the
/// token alone, read by a process outside the turn, is not enough.
///
/// Errors: the refusal's reason, naming the client's port and, when known,
/// nothing of the process (it is not the turn's).
async fn from_the_turn(shared: &Arc<Shared>, client: SocketAddr) -> Result<(), String> {
    let server = shared.address;
    let runner = shared.runner;
    let Some(inode) = peer::client_socket(client, server) else {
        return Err(format!(
            "the connection from {client} is not a socket of this network namespace"
        ));
    };
    let known = crate::concurrency::lock(&shared.grant)
        .as_ref()
        .is_some_and(|g| g.peers.contains(&inode));
    if known {
        return Ok(());
    }
    let holder = tokio::task::spawn_blocking(move || peer::turn_process_holding(inode, runner))
        .await
        .ok()
        .flatten();
    match holder {
        Some(pid) => {
            tracing::debug!(pid, client = %client, "agent API proxy: a connection from a process of the turn");
            if let Some(g) = crate::concurrency::lock(&shared.grant).as_mut() {
                g.peers.insert(inode);
            }
            Ok(())
        }
        None => Err(format!(
            "the connection from {client} is not held by a process of the turn (a proxy token serves only the turn it was made for, in the processes the runner started for it)"
        )),
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(super::listener::Client(client)): ConnectInfo<super::listener::Client>,
    request: Request,
) -> Response {
    let method = request.method().as_str().to_string();
    let path = request.uri().path().to_string();
    let (route, value) = match check(&shared, &request) {
        Ok(ok) => ok,
        Err((refusal, route, why)) => return refuse(refusal, route, &method, &path, &why),
    };
    if let Err(why) = from_the_turn(&shared, client).await {
        return refuse(Refusal::OutsideTurn, Some(route), &method, &path, &why);
    }
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, REQUEST_CAP).await {
        Ok(b) => b,
        Err(_) => {
            return refuse(
                Refusal::TooLarge,
                Some(route),
                &method,
                &path,
                &format!("the request body is over {REQUEST_CAP} bytes or was cut short"),
            );
        }
    };
    let headers = only(&parts.headers, REQUEST_HEADERS);
    match forward(&shared, route, &value, headers, body).await {
        Ok(response) => {
            // Debug, not info: an agent may poll its session in a loop.
            tracing::debug!(
                route = route.name(),
                status = response.status().as_u16(),
                "agent API proxy forwarded a request"
            );
            response
        }
        Err(why) => refuse(Refusal::Upstream, Some(route), &method, &path, &why),
    }
}

/// Sends the request to the coordinator with the current bearer; a `401`
/// with the bearer that is still current pulls a fresh one once and sends
/// again (PROTOCOL.md 2, "Expired bearer"). Streams the answer back.
///
/// Errors: the text of a transport failure (redacted), or an answer over
/// the route's cap by its `Content-Length`.
async fn forward(
    shared: &Shared,
    route: Route,
    value: &str,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, String> {
    let spec = route.spec();
    let url = shared
        .upstream
        .join(&route.path(value))
        .map_err(|e| format!("no upstream URL: {e}"))?;
    let method = match spec.method {
        Method::Get => reqwest::Method::GET,
        Method::Post => reqwest::Method::POST,
    };
    let timeout = shared.api.timings().request_timeout;
    let send = |bearer: &Secret| {
        shared
            .http
            .request(method.clone(), url.clone())
            .headers(headers.clone())
            .bearer_auth(bearer.expose())
            .timeout(timeout)
            .body(body.clone())
            .send()
    };
    let bearer = shared
        .api
        .usable_bearer()
        .await
        .map(|b| b.token)
        .map_err(|e| shared.redactor.redact(&format!("no bearer: {e}")))?;
    let mut upstream = send(&bearer).await.map_err(|e| transport(shared, e))?;
    if upstream.status() == reqwest::StatusCode::UNAUTHORIZED {
        let current = shared.api.bearer().map(|b| b.token);
        let fresh = match current {
            Some(c) if c != bearer => c,
            _ => pull(shared).await?,
        };
        upstream = send(&fresh).await.map_err(|e| transport(shared, e))?;
    }
    streamed(upstream, spec.cap)
}

async fn pull(shared: &Shared) -> Result<Secret, String> {
    shared
        .api
        .pull_bearer(Policy::AGENT_TOKEN_REFRESH)
        .await
        .map(|b| b.token)
        .map_err(|e| shared.redactor.redact(&format!("no bearer: {e}")))
}

fn transport(shared: &Shared, e: reqwest::Error) -> String {
    shared
        .redactor
        .redact(&format!("the coordinator could not be reached: {e}"))
}

/// The coordinator's answer as the agent gets it: its status, the headers
/// of [`ANSWER_HEADERS`], its body read through `cap` (a `Content-Length`
/// over it is refused before any byte; a longer body is cut off there,
/// which the agent sees as a connection closed mid-body).
fn streamed(upstream: reqwest::Response, cap: usize) -> Result<Response, String> {
    if let Some(len) = upstream.content_length()
        && len > cap as u64
    {
        return Err(format!(
            "the coordinator's answer is {len} bytes, over the route's cap of {cap}"
        ));
    }
    let status = upstream.status();
    let headers = only(upstream.headers(), ANSWER_HEADERS);
    let mut seen = 0usize;
    let body = upstream.bytes_stream().map(move |chunk| {
        let chunk = chunk.map_err(std::io::Error::other)?;
        seen = seen.saturating_add(chunk.len());
        if seen > cap {
            tracing::warn!(
                cap,
                "agent API proxy: the coordinator's answer passed the route's cap; cut off"
            );
            return Err(std::io::Error::other("over the route's cap"));
        }
        Ok(chunk)
    });
    let mut response = Response::new(Body::from_stream(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    Ok(response)
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderName;

    use super::*;

    #[test]
    fn tokens_are_64_hex_characters_and_differ() {
        let a = random_token().unwrap();
        let b = random_token().unwrap();
        assert_eq!(a.expose().len(), 2 * TOKEN_BYTES);
        assert!(a.expose().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn token_comparison_needs_every_byte() {
        assert!(same_token(b"abcd", b"abcd"));
        assert!(!same_token(b"abce", b"abcd"));
        assert!(!same_token(b"abc", b"abcd"));
        assert!(!same_token(b"", b"abcd"));
    }

    #[test]
    fn only_the_contracts_headers_pass_either_way() {
        let mut h = HeaderMap::new();
        for (name, value) in [
            ("connection", "close, x-private"),
            ("x-private", "1"),
            ("transfer-encoding", "chunked"),
            ("authorization", "Bearer x"),
            ("host", "example.invalid"),
            ("x-original-url", "/api/cli/sessions/s1/env-bundle"),
            ("x-http-method-override", "POST"),
            ("x-rewrite-url", "/x"),
            ("x-forwarded-host", "evil.invalid"),
            ("forwarded", "host=evil.invalid"),
            ("x-forwarded-prefix", "/api"),
            ("content-type", "application/json"),
            ("prefer", "wait=20"),
            ("if-none-match", "\"v1\""),
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
            ("retry-after", "2"),
            ("etag", "\"v2\""),
        ] {
            h.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        let names =
            |m: HeaderMap| -> Vec<String> { m.keys().map(|k| k.as_str().to_string()).collect() };
        assert_eq!(
            names(only(&h, REQUEST_HEADERS)),
            vec!["content-type", "prefer", "if-none-match", "traceparent"]
        );
        assert_eq!(
            names(only(&h, ANSWER_HEADERS)),
            vec!["content-type", "retry-after", "etag"]
        );
    }
}
