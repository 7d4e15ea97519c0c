//! opencode (`--agent opencode`): one `opencode serve` per turn, on loopback,
//!
//! ```text
//! opencode serve --hostname 127.0.0.1 --port <ORIZU_OPENCODE_PORT or 0>
//!                [--agent-arg …]
//! env: OPENCODE_SERVER_USERNAME=opencode, OPENCODE_SERVER_PASSWORD=<random, per turn>
//! ```
//!
//! then (with port 0, once the server printed the port it got: `opencode
//! server listening on http://127.0.0.1:<port>`, as opencode's own SDK reads
//! it), over HTTP with basic auth: wait for `GET /global/health`, open the
//! event stream `GET /event`, create the session (`POST /session`) or check
//! the one to resume (`GET /session/:id`), send the prompt (`POST
//! /session/:id/prompt_async` with the model of `clientInfo` as
//! `{providerID, modelID}` and its effort as `variant`), and follow the events until the session is
//! idle; `POST /session/:id/abort` interrupts. The server does not exit by
//! itself: the runner stops it shortly after the turn's end. Permission
//! requests for the session are answered `always` (the sandbox is the
//! boundary). opencode retries provider errors forever, so a retry notice
//! that names an exhausted quota, or the ninth retry of a turn, gives up on
//! the turn with the classified error rather than hang.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use super::classify::{self, from_http_status};
use super::command::event_for_line;
use super::lenient;
use super::sse::SseParser;
use super::usage::Totals;
use super::{
    Adapter, AdapterCommand, AdapterIo, AgentError, Effects, ExitRule, Launch, Note, Observation,
    StdinMode, Terminal, TurnSpec, Usage,
};
use crate::events::event::AgentEvent;
use crate::process::output::LineReceiver;
use crate::process::supervisor::Stream;
use crate::redact::{Redactor, SecretKind};
use crate::secret::Secret;
use crate::wire::ErrorCode;

/// The basic-auth user name of the server.
pub const USERNAME: &str = "opencode";
/// The variable that carries the server's basic-auth password.
const PASSWORD_VAR: &str = "OPENCODE_SERVER_PASSWORD";
/// Retry notices of one turn after which the runner gives up on it.
pub const MAX_RETRIES: u32 = 8;

/// The start of the line `opencode serve` prints once it listens, before
/// its URL.
const LISTENING: &str = "opencode server listening on ";

/// The `opencode serve` adapter for one process.
pub struct OpenCodeAdapter {
    spec: TurnSpec,
    /// `ORIZU_OPENCODE_PORT`; `None`: the server picks a free port itself.
    port: Option<u16>,
    password: Secret,
}

impl OpenCodeAdapter {
    /// For one turn: the port is `ORIZU_OPENCODE_PORT`, else the server's
    /// choice; the server password is fresh and goes to `redactor` at once.
    pub fn new(spec: TurnSpec, redactor: &Redactor) -> Self {
        let port = spec.opencode_port;
        let password = Secret::new(format!(
            "{:016x}{:016x}",
            fastrand::u64(..),
            fastrand::u64(..)
        ));
        redactor.add(&password, SecretKind::Credential);
        OpenCodeAdapter {
            spec,
            port,
            password,
        }
    }
}

/// The port of the line `opencode serve` prints once it listens
/// (`opencode server listening on http://127.0.0.1:4096`).
fn listening_port(line: &str) -> Option<u16> {
    let url = line.trim().strip_prefix(LISTENING)?;
    let (_, port) = url.trim_end_matches('/').rsplit_once(':')?;
    port.parse().ok().filter(|p| *p != 0)
}

impl Adapter for OpenCodeAdapter {
    fn launch(&self) -> Launch {
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--hostname".into(),
            "127.0.0.1".into(),
            "--port".into(),
            // Without a configured port the server binds port 0 and prints
            // the port it got. A port the runner probed free and passed on
            // would be free to anyone until the server binds it, seconds
            // later under load: any bind to port 0 on the host (another
            // runner's agent API proxy, another server) could take it, and
            // the server would exit `EADDRINUSE` (an `agent_crashed` turn).
            self.port.unwrap_or(0).to_string(),
        ];
        args.extend(self.spec.extra_args.iter().cloned());
        Launch {
            args,
            env: vec![
                (
                    "OPENCODE_SERVER_USERNAME".to_string(),
                    Secret::new(USERNAME.to_string()),
                ),
                (PASSWORD_VAR.to_string(), self.password.clone()),
            ],
            stdin: StdinMode::Bytes(Vec::new()),
            protocol_interrupt: true,
            server: true,
            exit_rule: ExitRule::NeedsTerminal,
            stop_signal: rustix::process::Signal::TERM,
            wrap_up: false,
        }
    }

    fn adopt(&mut self, started: &Launch) {
        // The pre-started server's password, made for it alone: the turn
        // adopts it only to compare and to use that server (a cold start
        // after a discard gets an adapter, and a password, of its own).
        if let Some((_, password)) = started.env.iter().find(|(k, _)| k == PASSWORD_VAR) {
            self.password = password.clone();
        }
    }

    fn warm_up(
        &self,
        lines: LineReceiver,
        done: tokio::sync::oneshot::Receiver<()>,
    ) -> BoxFuture<'static, LineReceiver> {
        let server = (self.port, self.password.clone());
        let session = self.spec.resume.clone();
        warm_up(lines, server, session, self.spec.timings.server_ready, done).boxed()
    }

    fn run(self: Box<Self>, io: AdapterIo) -> BoxFuture<'static, Observation> {
        run(*self, io).boxed()
    }
}

/// Bytes of output the warm-up keeps for the turn while it looks for the
/// port the server prints.
const WARM_UP_KEEPS: usize = 1 << 20;

/// A pre-started server's wait (issue 38): once it listens and is healthy,
/// `GET /config` and `GET /config/providers` load its configuration and
/// provider package (about 1 s of a first prompt's latency, measured with
/// 1.18.33), and `GET /session/:id` the session it will resume. Loading
/// the configuration loads opencode's plugins, which then run before the
/// turn (PROTOCOL.md 4.2). Stops when `done` fires,
/// and gives up quietly after `bound` or when the output ends: the turn's
/// adapter then finds the server as it is and reports what it sees.
async fn warm_up(
    mut lines: LineReceiver,
    (port, password): (Option<u16>, Secret),
    session: Option<String>,
    bound: Duration,
    done: tokio::sync::oneshot::Receiver<()>,
) -> LineReceiver {
    let mut read = Vec::new();
    let mut kept = 0;
    let warming = tokio::time::timeout(bound, async {
        let port = match port {
            Some(port) => port,
            None => loop {
                let (stream, line) = lines.recv().await?;
                let port = (stream == Stream::Stdout)
                    .then(|| listening_port(&line.text()))
                    .flatten();
                kept += line.bytes.len();
                read.push((stream, line));
                if let Some(port) = port {
                    break port;
                }
                // What it keeps for the turn is bounded, as the output's
                // channel is: past that the turn's adapter reads the rest.
                if kept > WARM_UP_KEEPS {
                    return None;
                }
            },
        };
        let http = Http::new(port, password).ok()?;
        wait_healthy(&http, bound).await.ok()?;
        let session = session.map(|id| format!("/session/{id}"));
        for path in ["/config", "/config/providers"]
            .into_iter()
            .chain(session.as_deref())
        {
            let answer = http.request(reqwest::Method::GET, path).send().await;
            if !answer.is_ok_and(|a| a.status().is_success()) {
                return None;
            }
        }
        Some(())
    });
    let warmed = tokio::select! {
        warmed = warming => matches!(warmed, Ok(Some(()))),
        _ = done => false,
    };
    tracing::debug!(warmed, "pre-started opencode server's warm-up over");
    lines.unread(read);
    lines
}

/// What the connection task reports.
#[derive(Debug)]
enum Server {
    /// The session of the turn.
    Session(String),
    /// The prompt was accepted.
    Prompted,
    /// An event of the stream.
    Event(Value),
    /// Setting up failed.
    Failed(AgentError),
}

#[derive(Clone)]
struct Http {
    client: reqwest::Client,
    base: String,
    password: Secret,
}

impl Http {
    fn new(port: u16, password: Secret) -> Result<Http, String> {
        crate::tls::install_crypto_provider();
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {}", e.without_url()))?;
        Ok(Http {
            client,
            base: format!("http://127.0.0.1:{port}"),
            password,
        })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.client
            .request(method, format!("{}{path}", self.base))
            .basic_auth(USERNAME, Some(self.password.expose()))
    }
}

#[derive(Debug, Default)]
struct State {
    session: Option<String>,
    prompted: bool,
    busy: bool,
    terminal: Option<Terminal>,
    error: Option<AgentError>,
    aborted: bool,
    retries: u32,
    gave_up: bool,
    effects: Effects,
    model: Option<String>,
    /// Usage of each step, by part id (a part is updated more than once).
    steps: Vec<(String, Usage)>,
}

async fn run(adapter: OpenCodeAdapter, mut io: AdapterIo) -> Observation {
    let OpenCodeAdapter {
        spec,
        port,
        password,
    } = adapter;
    let mut state = State {
        model: spec.model.clone(),
        ..State::default()
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let (mut http, mut setup) = (None, None);
    // Without a configured port, until the server printed the one it got:
    // the setup's sender, and the bound on that line.
    let mut pending = None;
    match port {
        Some(port) => (http, setup) = start_setup(&spec, &mut io, &password, port, tx, &cancel),
        None => pending = Some((tx, tokio::time::Instant::now() + spec.timings.server_ready)),
    }
    let mut commands_open = true;
    let mut server_open = true;
    tracing::debug!(?port, "opencode adapter started");
    loop {
        tokio::select! {
            line = io.lines.recv() => {
                let Some((stream, line)) = line else { break };
                if stream == Stream::Stdout
                    && let Some(port) = listening_port(&line.text())
                    && let Some((tx, _)) = pending.take()
                {
                    (http, setup) = start_setup(&spec, &mut io, &password, port, tx, &cancel);
                }
                io.events
                    .emit_agent(event_for_line(io.events.fresh_redactor(), stream, &line));
            }
            () = crate::concurrency::sleep_until(pending.as_ref().map(|(_, at)| *at)), if pending.is_some() => {
                pending = None;
                let e = crashed(format!(
                    "opencode serve did not print the port it listens on within {}",
                    humantime::format_duration(spec.timings.server_ready)
                ));
                io.note(Note::Abort(e));
            }
            msg = rx.recv(), if server_open && setup.is_some() => match msg {
                Some(msg) => server_message(&spec, &mut state, &mut io, http.as_ref(), msg),
                None => server_open = false,
            },
            cmd = io.commands.recv(), if commands_open => match cmd {
                Some(AdapterCommand::ProtocolInterrupt) => {
                    cancel.store(true, Ordering::SeqCst);
                    abort(&state, http.as_ref());
                }
                // Not sent: its launch takes no wrap-up.
                Some(AdapterCommand::WrapUp) => {}
                None => commands_open = false,
            },
        }
    }
    if let Some(task) = setup {
        task.abort();
    }
    let mut usage = Usage {
        model: state.model.clone(),
        ..Usage::default()
    };
    for (_, step) in &state.steps {
        usage.add(step);
    }
    Observation {
        terminal: state.terminal,
        failure: state.error,
        usage,
        effects: state.effects,
    }
}

/// Starts the setup ([`connect`]) on the server at `port` (the configured
/// one, or the one the server printed): its client and task.
fn start_setup(
    spec: &TurnSpec,
    io: &mut AdapterIo,
    password: &Secret,
    port: u16,
    tx: mpsc::UnboundedSender<Server>,
    cancel: &Arc<AtomicBool>,
) -> (Option<Http>, Option<tokio::task::JoinHandle<()>>) {
    tracing::debug!(port, "opencode serve port");
    match Http::new(port, password.clone()) {
        Ok(h) => {
            let task = tokio::spawn(connect(h.clone(), spec.clone(), tx, cancel.clone()));
            (Some(h), Some(task))
        }
        Err(e) => {
            io.note(Note::Abort(AgentError::new(ErrorCode::AgentCrashed, e)));
            (None, None)
        }
    }
}

/// The protocol interrupt: `POST /session/:id/abort`, unless the session
/// is not there yet (the setup then stops before the prompt) or its turn
/// already ended.
fn abort(state: &State, http: Option<&Http>) {
    if let (Some(h), Some(sid)) = (http, &state.session)
        && state.terminal.is_none()
    {
        let req = h.request(reqwest::Method::POST, &format!("/session/{sid}/abort"));
        tokio::spawn(async move {
            if let Err(e) = req.send().await {
                tracing::warn!(error = %e.without_url(), "opencode abort request failed");
            }
        });
    }
}

fn server_message(
    spec: &TurnSpec,
    state: &mut State,
    io: &mut AdapterIo,
    http: Option<&Http>,
    msg: Server,
) {
    match msg {
        Server::Session(id) => {
            io.note(Note::SessionId(id.clone()));
            state.session = Some(id);
        }
        Server::Prompted => state.prompted = true,
        Server::Failed(e) => {
            if state.error.is_none() {
                state.error = Some(e.clone());
            }
            io.note(Note::Abort(e));
        }
        Server::Event(event) => {
            let Envelope { kind, properties } = lenient::read(&event);
            let kind = kind.unwrap_or_default();
            let props = properties;
            // A heartbeat is the server's, not the agent's: it does not keep
            // the idle watchdog quiet.
            if kind.is_empty() || kind == "server.heartbeat" || kind == "server.connected" {
                return;
            }
            io.note(Note::Activity);
            if kind == "message.part.delta" {
                return;
            }
            // The server's events never went through the output redaction:
            // the type and the data are redacted here, by value.
            let redactor = io.events.fresh_redactor();
            let agent_event =
                AgentEvent::named(redactor, kind.clone(), props.clone(), || event.clone());
            io.events.emit_agent(agent_event);
            handle_event(spec, state, io, http, &kind, &props);
        }
    }
}

fn handle_event(
    spec: &TurnSpec,
    state: &mut State,
    io: &mut AdapterIo,
    http: Option<&Http>,
    kind: &str,
    props: &Value,
) {
    let Some(sid) = state.session.clone() else {
        return;
    };
    if lenient::read::<Scope>(props)
        .session()
        .is_some_and(|s| s != sid)
    {
        return;
    }
    match Event::read(kind, props) {
        Event::Status(StatusProps { status }) => session_status(state, io, status),
        Event::Idle(_) => idle(state, io),
        Event::SessionError(ErrorProps { error }) => {
            if let Some(error) = &error {
                record_error(spec, state, error);
            }
        }
        Event::MessageUpdated(MessageProps { info }) => message_updated(spec, state, info),
        Event::PartUpdated(PartProps { part }) => part_updated(state, part),
        Event::Permission(PermissionProps { id }) => {
            if let (Some(h), Some(id)) = (http, &id) {
                allow(h, &sid, id);
            }
        }
        Event::Other => {}
    }
}

/// `session.status`: busy, idle, or a retry notice. opencode retries
/// provider errors forever: an exhausted quota, or more than
/// [`MAX_RETRIES`] notices, gives up on the turn.
fn session_status(state: &mut State, io: &mut AdapterIo, status: Status) {
    match status {
        Status::Busy => state.busy = true,
        Status::Idle => idle(state, io),
        Status::Retry(Retry { message }) => {
            state.retries += 1;
            let message = message.as_deref().unwrap_or("");
            let code = classify::from_text(message, false);
            let give_up = if code == Some(ErrorCode::ProviderQuotaExhausted) {
                Some(ErrorCode::ProviderQuotaExhausted)
            } else if state.retries > MAX_RETRIES {
                Some(code.unwrap_or(ErrorCode::ProviderLimitUnknown))
            } else {
                None
            };
            if let Some(code) = give_up
                && !state.gave_up
            {
                state.gave_up = true;
                let e = AgentError::new(
                    code,
                    classify::clip(&format!(
                        "opencode was retrying (attempt {}): {message}",
                        state.retries
                    )),
                );
                io.note(Note::Abort(e));
            }
        }
        Status::Other => {}
    }
}

/// `message.updated`: an assistant message names the model and may carry
/// the turn's error.
fn message_updated(spec: &TurnSpec, state: &mut State, info: MessageInfo) {
    if info.role.as_deref() != Some("assistant") {
        return;
    }
    if let Some(m) = info.model_id {
        state.model = Some(match info.provider_id {
            Some(p) => format!("{p}/{m}"),
            None => m,
        });
    }
    if let Some(error) = &info.error {
        record_error(spec, state, error);
    }
}

/// `message.part.updated`: a tool, patch or subtask part is an effect; a
/// `step-finish` part carries the step's usage (the last update wins).
fn part_updated(state: &mut State, part: Part) {
    match part.kind.as_deref().unwrap_or("") {
        "tool" | "patch" | "subtask" => state.effects = Effects::Some,
        "step-finish" => record_step(&mut state.steps, &part),
        _ => {}
    }
}

/// A step's usage by its part id: a part is updated more than once, the
/// last update wins (`opencode run`'s `step_finish` too).
pub fn record_step(steps: &mut Vec<(String, Usage)>, part: &Part) {
    let id = part.id.clone().unwrap_or_default();
    let usage = step_usage(part);
    match steps.iter_mut().find(|(i, _)| *i == id) {
        Some(slot) => slot.1 = usage,
        None => steps.push((id, usage)),
    }
}

/// Answers permission request `id` of session `sid` `always` (the sandbox
/// is the boundary).
fn allow(http: &Http, sid: &str, id: &str) {
    let req = http
        .request(
            reqwest::Method::POST,
            &format!("/session/{sid}/permissions/{id}"),
        )
        .json(&json!({"response": "always"}));
    tokio::spawn(async move {
        if let Err(e) = req.send().await {
            tracing::warn!(error = %e.without_url(), "answering an opencode permission request failed");
        }
    });
}

fn idle(state: &mut State, io: &mut AdapterIo) {
    if state.terminal.is_some() || !(state.busy || state.prompted) {
        return;
    }
    state.terminal = Some(if state.aborted {
        Terminal::Aborted
    } else {
        match &state.error {
            Some(e) => Terminal::Failed(e.clone()),
            None => Terminal::Completed,
        }
    });
    io.note(Note::Terminal);
}

fn record_error(spec: &TurnSpec, state: &mut State, error: &OpenCodeError) {
    match classify_error(error, spec.resume.is_some()) {
        None => state.aborted = true,
        Some(e) => {
            if state.error.is_none() {
                state.error = Some(e);
            }
        }
    }
}

/// The usage of a `step-finish` part (`opencode run`'s `step_finish.part`
/// has the same shape).
pub fn step_usage(part: &Part) -> Usage {
    let t = &part.tokens;
    Usage {
        model: None,
        input_tokens: t.input,
        output_tokens: match (t.output, t.reasoning) {
            (Some(o), Some(r)) => Some(o + r),
            (o, None) => o,
            (None, r) => r,
        },
        cache_read_tokens: t.cache.read,
        cache_write_tokens: t.cache.write,
        cost_usd: part.cost,
    }
}

/// Classifies an opencode error `{name, data: {message, statusCode?,
/// isRetryable?, responseHeaders?, responseBody?}}`; `None` for
/// `MessageAbortedError` (the turn was aborted).
pub fn classify_error(error: &OpenCodeError, resuming: bool) -> Option<AgentError> {
    let name = error.name.as_deref().unwrap_or("");
    let data = &error.data;
    let message = data
        .message
        .as_deref()
        .or(error.message.as_deref())
        .unwrap_or(name)
        .to_string();
    let body = data.response_body.as_deref().unwrap_or("");
    let text = if body.is_empty() {
        message.clone()
    } else {
        format!("{message} {body}")
    };
    let err = |code| AgentError::new(code, classify::clip(&format!("{name}: {message}")));
    match name {
        "MessageAbortedError" => None,
        "ProviderAuthError" => Some(err(ErrorCode::ProviderAuth)),
        "ContextOverflowError" | "MessageOutputLengthError" => {
            Some(err(ErrorCode::ContextWindowExceeded))
        }
        "APIError" => {
            let status = data.status_code.and_then(|s| u16::try_from(s).ok());
            let header = |k: &str| {
                data.response_headers
                    .as_ref()
                    .and_then(|h| h.get(k))
                    .and_then(Value::as_str)
                    .and_then(|v| v.trim().parse::<f64>().ok())
            };
            let retry_after_ms = header("retry-after-ms")
                .or_else(|| header("retry-after").map(|s| s * 1000.0))
                .filter(|ms| ms.is_finite() && *ms >= 0.0)
                .map(|ms| ms as u64);
            let quota = body.contains("FreeUsageLimitError")
                || classify::from_text(&text, false) == Some(ErrorCode::ProviderQuotaExhausted);
            let code = match status {
                _ if quota => ErrorCode::ProviderQuotaExhausted,
                // A 429 that says how long to wait is a rate limit.
                Some(429) if retry_after_ms.is_some() => ErrorCode::ProviderRateLimited,
                Some(s) => from_http_status(s, &text),
                None => {
                    classify::from_text(&text, resuming).unwrap_or(ErrorCode::ProviderServerError)
                }
            };
            let e = err(code);
            Some(if code == ErrorCode::ProviderRateLimited {
                e.retry_after(retry_after_ms)
            } else {
                e
            })
        }
        _ => Some(err(
            classify::from_text(&text, resuming).unwrap_or(ErrorCode::AgentCrashed)
        )),
    }
}

/// Sets up the turn on the server (health, event stream, session, prompt)
/// and reports each step on `tx`; the first step that fails is reported
/// as [`Server::Failed`] and ends the setup.
async fn connect(
    http: Http,
    spec: TurnSpec,
    tx: mpsc::UnboundedSender<Server>,
    cancel: Arc<AtomicBool>,
) {
    if let Err(e) = set_up(&http, &spec, &tx, &cancel).await {
        let _ = tx.send(Server::Failed(e));
    }
}

async fn set_up(
    http: &Http,
    spec: &TurnSpec,
    tx: &mpsc::UnboundedSender<Server>,
    cancel: &AtomicBool,
) -> Result<(), AgentError> {
    wait_healthy(http, spec.timings.server_ready).await?;
    tracing::debug!(base = %http.base, "opencode server healthy");
    // The event stream before anything happens in the session.
    let stream = open_events(http).await?;
    tracing::debug!("opencode event stream open");
    tokio::spawn(forward_events(stream, tx.clone()));
    let sid = match &spec.resume {
        Some(id) => check_session(http, id).await?,
        None => create_session(http).await?,
    };
    tracing::debug!(session = %sid, "opencode session ready");
    if tx.send(Server::Session(sid.clone())).is_err() || cancel.load(Ordering::SeqCst) {
        tracing::debug!("opencode adapter gone or cancelled before the prompt");
        return Ok(());
    }
    send_prompt(http, spec, &sid).await?;
    let _ = tx.send(Server::Prompted);
    Ok(())
}

fn crashed(message: String) -> AgentError {
    AgentError::new(ErrorCode::AgentCrashed, message)
}

/// Polls `GET /global/health` until it answers 2xx, for at most `bound`.
async fn wait_healthy(http: &Http, bound: Duration) -> Result<(), AgentError> {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let healthy = http
            .request(reqwest::Method::GET, "/global/health")
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success());
        if healthy.is_some() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(crashed(format!(
                "opencode serve did not answer {}/global/health within {}",
                http.base,
                humantime::format_duration(bound)
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET /event`: the server's event stream.
async fn open_events(http: &Http) -> Result<reqwest::Response, AgentError> {
    match http.request(reqwest::Method::GET, "/event").send().await {
        Ok(r) if r.status().is_success() => Ok(r),
        Ok(r) => Err(crashed(format!(
            "opencode serve refused its event stream: {}",
            r.status()
        ))),
        Err(e) => Err(crashed(format!(
            "cannot open the opencode event stream: {}",
            e.without_url()
        ))),
    }
}

/// Parses the event stream and sends each event on `tx`, until the stream
/// ends or the adapter is gone.
async fn forward_events(mut stream: reqwest::Response, tx: mpsc::UnboundedSender<Server>) {
    let mut parser = SseParser::new();
    loop {
        let chunk = match stream.chunk().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => {
                tracing::debug!("the opencode event stream ended");
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e.without_url(), "the opencode event stream failed");
                return;
            }
        };
        for data in parser.push(&chunk) {
            if let Ok(v) = serde_json::from_str::<Value>(&data)
                && tx.send(Server::Event(v)).is_err()
            {
                return;
            }
        }
    }
}

/// `GET /session/:id`: the session to resume exists (else `resume_failed`).
async fn check_session(http: &Http, id: &str) -> Result<String, AgentError> {
    match http
        .request(reqwest::Method::GET, &format!("/session/{id}"))
        .send()
        .await
    {
        Ok(r) if r.status().is_success() => Ok(id.to_string()),
        Ok(r) => {
            let status = r.status();
            let body = r.text().await.unwrap_or_default();
            Err(AgentError::new(
                ErrorCode::ResumeFailed,
                classify::clip(&format!(
                    "opencode has no session {id} to resume ({status}): {body}"
                )),
            ))
        }
        Err(e) => Err(crashed(format!(
            "cannot read the opencode session: {}",
            e.without_url()
        ))),
    }
}

/// `POST /session`: a new session's id.
async fn create_session(http: &Http) -> Result<String, AgentError> {
    let created = http
        .request(reqwest::Method::POST, "/session")
        .json(&json!({}))
        .send()
        .await;
    let body: Option<Value> = match created {
        Ok(r) if r.status().is_success() => r.json().await.ok(),
        Ok(r) => {
            return Err(crashed(format!(
                "opencode refused to create a session: {}",
                r.status()
            )));
        }
        Err(e) => {
            return Err(crashed(format!(
                "cannot create an opencode session: {}",
                e.without_url()
            )));
        }
    };
    body.and_then(|b| lenient::read::<Created>(&b).id)
        .ok_or_else(|| crashed("opencode created a session without an id".to_string()))
}

/// `POST /session/:id/prompt_async` with the prompt and the model of
/// `clientInfo` as `{providerID, modelID}`.
async fn send_prompt(http: &Http, spec: &TurnSpec, sid: &str) -> Result<(), AgentError> {
    let mut body = json!({"parts": [{"type": "text", "text": spec.prompt}]});
    // The prompt's `system`, added to opencode's own system prompt.
    if let Some(i) = &spec.instructions {
        body["system"] = json!(i.text);
    }
    // The model's variant, as `opencode run --variant` sends it: opencode
    // maps it onto the provider's reasoning setting for a model that has
    // that variant (PROTOCOL.md 7, "Verified against the real CLIs").
    if let Some(effort) = &spec.effort {
        body["variant"] = json!(effort);
    }
    if let Some(model) = &spec.model {
        body["model"] = match model.split_once('/') {
            Some((provider, id)) => json!({"providerID": provider, "modelID": id}),
            None => json!({"modelID": model}),
        };
    }
    match http
        .request(
            reqwest::Method::POST,
            &format!("/session/{sid}/prompt_async"),
        )
        .json(&body)
        .send()
        .await
    {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => {
            let status = r.status();
            let text = r.text().await.unwrap_or_default();
            let code = classify::from_text(&text, false).unwrap_or(ErrorCode::InvalidRequest);
            Err(AgentError::new(
                code,
                classify::clip(&format!("opencode refused the prompt ({status}): {text}")),
            ))
        }
        Err(e) => Err(crashed(format!(
            "cannot send the prompt to opencode: {}",
            e.without_url()
        ))),
    }
}

/// An event of the stream: `{type, properties}`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Envelope {
    #[serde(rename = "type", deserialize_with = "lenient::value")]
    kind: Option<String>,
    properties: Value,
}

/// The events the adapter reads (of its session); every event but the
/// server's own and the deltas is forwarded whatever it is.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", content = "properties")]
enum Event {
    #[serde(rename = "session.status", deserialize_with = "lenient::object")]
    Status(StatusProps),
    #[serde(rename = "session.idle")]
    Idle(IgnoredAny),
    #[serde(rename = "session.error", deserialize_with = "lenient::object")]
    SessionError(ErrorProps),
    #[serde(rename = "message.updated", deserialize_with = "lenient::object")]
    MessageUpdated(MessageProps),
    #[serde(rename = "message.part.updated", deserialize_with = "lenient::object")]
    PartUpdated(PartProps),
    #[serde(
        rename = "permission.asked",
        alias = "permission.updated",
        deserialize_with = "lenient::object"
    )]
    Permission(PermissionProps),
    #[serde(other)]
    Other,
}

impl Event {
    /// Event `kind` with its `properties` (`null` when it had none).
    fn read(kind: &str, props: &Value) -> Event {
        lenient::adjacent(("type", kind), ("properties", props)).unwrap_or(Event::Other)
    }
}

/// Where an event names its session: `sessionID`, else `info.sessionID`,
/// else `part.sessionID`; the first of them present decides, even when it
/// is no string.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Scope {
    #[serde(rename = "sessionID", deserialize_with = "lenient::present")]
    session_id: Option<Value>,
    #[serde(deserialize_with = "lenient::object")]
    info: ScopeRef,
    #[serde(deserialize_with = "lenient::object")]
    part: ScopeRef,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ScopeRef {
    #[serde(rename = "sessionID", deserialize_with = "lenient::present")]
    session_id: Option<Value>,
}

impl Scope {
    /// The session the event is about, if it names one.
    fn session(&self) -> Option<&str> {
        self.session_id
            .as_ref()
            .or(self.info.session_id.as_ref())
            .or(self.part.session_id.as_ref())
            .and_then(Value::as_str)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StatusProps {
    #[serde(deserialize_with = "lenient::object")]
    status: Status,
}

/// A session's status.
#[derive(Debug, Default, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Status {
    Busy,
    Idle,
    Retry(Retry),
    #[default]
    #[serde(other)]
    Other,
}

/// A retry notice.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Retry {
    #[serde(deserialize_with = "lenient::value")]
    message: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ErrorProps {
    #[serde(deserialize_with = "lenient::member")]
    error: Option<OpenCodeError>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct MessageProps {
    #[serde(deserialize_with = "lenient::object")]
    info: MessageInfo,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct MessageInfo {
    #[serde(deserialize_with = "lenient::value")]
    role: Option<String>,
    #[serde(rename = "providerID", deserialize_with = "lenient::value")]
    provider_id: Option<String>,
    #[serde(rename = "modelID", deserialize_with = "lenient::value")]
    model_id: Option<String>,
    #[serde(deserialize_with = "lenient::non_null")]
    error: Option<OpenCodeError>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PartProps {
    #[serde(deserialize_with = "lenient::object")]
    part: Part,
}

/// A message part (`opencode run`'s `step_finish.part` has the same shape).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Part {
    #[serde(rename = "type", deserialize_with = "lenient::value")]
    kind: Option<String>,
    #[serde(deserialize_with = "lenient::value")]
    id: Option<String>,
    #[serde(deserialize_with = "lenient::object")]
    tokens: Tokens,
    #[serde(deserialize_with = "lenient::value")]
    cost: Option<f64>,
}

/// A step's tokens.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Tokens {
    #[serde(deserialize_with = "lenient::count")]
    input: Option<u64>,
    #[serde(deserialize_with = "lenient::count")]
    output: Option<u64>,
    #[serde(deserialize_with = "lenient::count")]
    reasoning: Option<u64>,
    #[serde(deserialize_with = "lenient::object")]
    cache: Cache,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Cache {
    #[serde(deserialize_with = "lenient::count")]
    read: Option<u64>,
    #[serde(deserialize_with = "lenient::count")]
    write: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PermissionProps {
    #[serde(deserialize_with = "lenient::value")]
    id: Option<String>,
}

/// An opencode error `{name, data: {message, statusCode?, isRetryable?,
/// responseHeaders?, responseBody?}}` (some have their `message` outside
/// `data`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct OpenCodeError {
    #[serde(deserialize_with = "lenient::value")]
    name: Option<String>,
    #[serde(deserialize_with = "lenient::object")]
    data: ErrorData,
    #[serde(deserialize_with = "lenient::value")]
    message: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct ErrorData {
    #[serde(deserialize_with = "lenient::value")]
    message: Option<String>,
    #[serde(deserialize_with = "lenient::count")]
    status_code: Option<u64>,
    #[serde(deserialize_with = "lenient::value")]
    response_headers: Option<Map<String, Value>>,
    #[serde(deserialize_with = "lenient::value")]
    response_body: Option<String>,
}

/// `POST /session`'s answer.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Created {
    #[serde(deserialize_with = "lenient::value")]
    id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_errors_are_classified() {
        let c = |v: Value| {
            classify_error(&lenient::read(&v), false).map(|e| (e.code, e.retry_after_ms))
        };
        assert_eq!(
            c(
                json!({"name": "APIError", "data": {"message": "Too Many Requests", "statusCode": 429,
                "isRetryable": true, "responseHeaders": {"retry-after": "7"}}})
            ),
            Some((ErrorCode::ProviderRateLimited, Some(7000)))
        );
        assert_eq!(
            c(
                json!({"name": "APIError", "data": {"message": "Too Many Requests", "statusCode": 429,
                "responseBody": "{\"type\":\"error\",\"error\":{\"type\":\"FreeUsageLimitError\"}}"}})
            ),
            Some((ErrorCode::ProviderQuotaExhausted, None))
        );
        assert_eq!(
            c(json!({"name": "APIError", "data": {"message": "", "statusCode": 429}})),
            Some((ErrorCode::ProviderLimitUnknown, None))
        );
        assert_eq!(
            c(
                json!({"name": "APIError", "data": {"message": "Provider is overloaded", "statusCode": 529}})
            ),
            Some((ErrorCode::ProviderOverloaded, None))
        );
        assert_eq!(
            c(json!({"name": "APIError", "data": {"message": "oops", "statusCode": 500}})),
            Some((ErrorCode::ProviderServerError, None))
        );
        assert_eq!(
            c(
                json!({"name": "APIError", "data": {"message": "model not found", "statusCode": 404}})
            ),
            Some((ErrorCode::InvalidRequest, None))
        );
        assert_eq!(
            c(
                json!({"name": "ProviderAuthError", "data": {"providerID": "anthropic", "message": "bad key"}})
            ),
            Some((ErrorCode::ProviderAuth, None))
        );
        assert_eq!(
            c(json!({"name": "ContextOverflowError", "data": {"message": "too long"}})),
            Some((ErrorCode::ContextWindowExceeded, None))
        );
        assert_eq!(
            c(json!({"name": "MessageAbortedError", "data": {"message": "Aborted"}})),
            None
        );
        assert_eq!(
            c(json!({"name": "UnknownError", "data": {"message": "segfault"}})),
            Some((ErrorCode::AgentCrashed, None))
        );
    }

    #[test]
    fn the_listening_line_names_the_port() {
        let p = listening_port;
        assert_eq!(
            p("opencode server listening on http://127.0.0.1:41873"),
            Some(41873)
        );
        assert_eq!(
            p("opencode server listening on http://127.0.0.1:4096/\r"),
            Some(4096)
        );
        assert_eq!(p("opencode server listening on http://127.0.0.1:0"), None);
        assert_eq!(p("listening on http://127.0.0.1:4096"), None);
        assert_eq!(p("opencode server listening on http://127.0.0.1"), None);
    }

    #[test]
    fn step_usage_counts_reasoning_as_output() {
        let u = step_usage(&lenient::read(
            &json!({"tokens": {"input": 1, "output": 2, "reasoning": 3,
            "cache": {"read": 4, "write": 5}}, "cost": 0.5}),
        ));
        assert_eq!(
            serde_json::to_value(u.reported()).unwrap(),
            json!({"inputTokens": 1, "outputTokens": 5, "cacheReadTokens": 4,
            "cacheWriteTokens": 5, "costUsd": 0.5})
        );
    }
    #[test]
    fn events_read_as_the_fake_server_writes_them() {
        let e = |v: Value| {
            let Envelope { kind, properties } = lenient::read(&v);
            Event::read(&kind.unwrap_or_default(), &properties)
        };
        assert!(matches!(
            e(
                json!({"type": "session.status", "properties": {"sessionID": "ses_1", "status": {"type": "busy"}}})
            ),
            Event::Status(StatusProps {
                status: Status::Busy
            })
        ));
        assert!(matches!(
            e(json!({"type": "session.status", "properties": {"sessionID": "ses_1",
                "status": {"type": "retry", "attempt": 1, "message": "Rate limited", "next": 1}}})),
            Event::Status(StatusProps { status: Status::Retry(Retry { message: Some(m) }) }) if m == "Rate limited"
        ));
        assert!(matches!(
            e(json!({"type": "session.status", "properties": {"status": {"type": "compacting"}}})),
            Event::Status(StatusProps {
                status: Status::Other
            })
        ));
        assert!(matches!(
            e(json!({"type": "session.idle", "properties": {"sessionID": "ses_1"}})),
            Event::Idle(_)
        ));
        let Event::MessageUpdated(MessageProps { info }) = e(json!({"type": "message.updated",
            "properties": {"info": {"id": "msg_1", "sessionID": "ses_1", "role": "assistant",
            "providerID": "anthropic", "modelID": "claude-sonnet-4-5", "error": null}}}))
        else {
            panic!("not message.updated");
        };
        assert_eq!(
            (
                info.role.as_deref(),
                info.provider_id.as_deref(),
                info.model_id.as_deref(),
                info.error.is_none()
            ),
            (
                Some("assistant"),
                Some("anthropic"),
                Some("claude-sonnet-4-5"),
                true
            )
        );
        let Event::PartUpdated(PartProps { part }) = e(json!({"type": "message.part.updated",
            "properties": {"part": {"id": "prt_step_1", "sessionID": "ses_1", "messageID": "msg_1",
            "type": "step-finish", "reason": "stop", "cost": 0.002, "tokens": {"input": 100,
            "output": 40, "reasoning": 10, "cache": {"read": 500, "write": 20}}}}}))
        else {
            panic!("not message.part.updated");
        };
        assert_eq!(part.kind.as_deref(), Some("step-finish"));
        assert_eq!(step_usage(&part).output_tokens, Some(50));
        let Event::SessionError(ErrorProps { error: Some(error) }) =
            e(json!({"type": "session.error",
            "properties": {"sessionID": "ses_1", "error": {"name": "MessageAbortedError",
            "data": {"message": "Aborted"}}}}))
        else {
            panic!("not session.error");
        };
        assert!(classify_error(&error, false).is_none());
        assert!(matches!(
            e(json!({"type": "permission.updated", "properties": {"id": "per_1", "sessionID": "ses_1"}})),
            Event::Permission(PermissionProps { id: Some(id) }) if id == "per_1"
        ));
        // Unknown types, no type, no properties.
        assert!(matches!(
            e(json!({"type": "server.heartbeat", "properties": {}})),
            Event::Other
        ));
        assert!(matches!(e(json!({"properties": {}})), Event::Other));
        assert!(matches!(e(json!({"type": "session.idle"})), Event::Idle(_)));
    }

    #[test]
    fn an_event_names_its_session_where_it_first_can() {
        let s = |v: Value| lenient::read::<Scope>(&v).session().map(str::to_string);
        assert_eq!(
            s(json!({"sessionID": "a", "info": {"sessionID": "b"}})).as_deref(),
            Some("a")
        );
        assert_eq!(
            s(json!({"info": {"sessionID": "b"}, "part": {"sessionID": "c"}})).as_deref(),
            Some("b")
        );
        assert_eq!(
            s(json!({"info": "x", "part": {"sessionID": "c"}})).as_deref(),
            Some("c")
        );
        // A member that is there but no string hides the later ones.
        assert_eq!(
            s(json!({"sessionID": null, "part": {"sessionID": "c"}})),
            None
        );
        assert_eq!(s(json!([1])), None);
    }
}
