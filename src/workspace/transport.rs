//! A git smart-HTTP subtransport over the runner's reqwest client, so that
//! git2's fetches and pushes use rustls and the runner's trust roots
//! (PROTOCOL.md section 1: one TLS stack for the runner, the clone and the
//! credential helper; git2 is built without its OpenSSL `https` feature).
//!
//! Protocol: stateless RPC ("smart HTTP"): `GET {url}/info/refs?service=…`
//! for the reference advertisement, `POST {url}/git-upload-pack` (or
//! `git-receive-pack`) for each negotiation round. Response bodies are
//! streamed chunk by chunk into libgit2's read buffer. Redirects are never
//! followed (the client has none; a 3xx is an error).
//!
//! Authentication: Basic with user `x-access-token` and the password from
//! the credential broker in process when the [`HttpContext`] has one
//! (broker mode: no helper process, no socket), else from the repository's
//! configured credential helper (PROTOCOL.md 2.5, 3).
//! libgit2's credential callback is bypassed by custom subtransports, so the
//! helper is run here: preemptively before the first request (no wasted
//! `401`); on a `401` the helper's `erase` runs (dropping a cached rejected
//! token) and `get` runs once more. At most two credential attempts per
//! connection (one clone or fetch), then the error says the server refused
//! the credentials twice. Tokens never appear in a URL, an error or a log.
//!
//! Threading: every HTTP call runs through `Handle::block_on` on the thread
//! libgit2 calls us on. Run git2 network operations from
//! `tokio::task::spawn_blocking` or a plain thread, **never from an async
//! task** (a worker thread: `block_on` would panic there), and with the
//! handle of a multi-thread runtime (a current-thread runtime's IO is only
//! driven by its own `Runtime::block_on`).
//!
//! Per remote, the caller registers an [`HttpContext`] and the credential
//! helpers with [`register_remote`]; the registration lives in a
//! process-global map keyed by the remote URL and ends when the returned
//! [`RemoteRegistration`] is dropped.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use git2::transport::{Service, SmartSubtransport, SmartSubtransportStream, Transport};
use git2::{ErrorClass, ErrorCode};
use reqwest::StatusCode;

use crate::redact::{Redactor, SecretKind};
use crate::secret::Secret;

/// The user name git authenticates with (PROTOCOL.md 2.5).
pub const GIT_USER: &str = "x-access-token";

/// At most this many credential attempts (helper `get` runs) per connection.
pub const MAX_CREDENTIAL_ATTEMPTS: u32 = 2;

/// The message of the error after the second refused credential.
pub const REFUSED_TWICE: &str = "the coordinator's git server refused the credentials twice";

/// What the transport needs to reach a remote.
#[derive(Clone, Debug)]
pub struct HttpContext {
    /// The runner's HTTP client ([`crate::tls::http_client`]: rustls, our
    /// roots, no redirects).
    pub client: reqwest::Client,
    /// Handle of the (multi-thread) runtime the HTTP calls run on.
    pub runtime: tokio::runtime::Handle,
    /// Bound on connecting and receiving the response headers of each
    /// request (`Timings::request_timeout`, 10 s).
    pub request_timeout: Duration,
    /// The runner's redactor: every password a credential helper gives the
    /// transport is added to it before the transport uses it (PROTOCOL.md
    /// section 3), whichever helper gave it.
    pub redactor: Redactor,
    /// The stall bound (`Timings::git_stall`, 30 s, PROTOCOL.md section 2):
    /// a response body that brings no byte for this long (nor for six
    /// request timeouts, which the harvest cuts to what is left of its
    /// bound) fails the transfer, as a transport failure.
    pub stall: Duration,
    /// Broker mode: the runner's credential broker, asked in process
    /// instead of running the credential helpers (a `read` token for a
    /// fetch, a `write` token for a push; a `401` erases the refused one).
    pub broker: Option<super::Broker>,
}

/// The credential helpers to run, resolved like git does from the
/// `credential.helper` entries (an empty entry resets the list; `!cmd` is a
/// shell command; an absolute path runs as is; a bare name runs
/// `git credential-<name>`), plus `credential.useHttpPath`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CredentialHelpers {
    /// The shell commands, in order (each gets ` get` or ` erase` appended).
    commands: Vec<String>,
    use_http_path: bool,
}

impl CredentialHelpers {
    /// Helpers from `credential.helper` values (in config order) and
    /// `credential.useHttpPath`.
    pub fn new<I, S>(helper_values: I, use_http_path: bool) -> CredentialHelpers
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut commands = Vec::new();
        for value in helper_values {
            let value = value.as_ref();
            if value.is_empty() {
                commands.clear();
            } else if let Some(cmd) = value.strip_prefix('!') {
                commands.push(cmd.to_string());
            } else if value.starts_with('/') {
                commands.push(value.to_string());
            } else {
                commands.push(format!("git credential-{value}"));
            }
        }
        CredentialHelpers {
            commands,
            use_http_path,
        }
    }

    /// Helpers configured in `config` (every level it holds, in order).
    ///
    /// Errors: a config that cannot be read.
    pub fn from_config(config: &git2::Config) -> Result<CredentialHelpers, git2::Error> {
        let mut values = Vec::new();
        let entries = config.multivar("credential.helper", None)?;
        entries.for_each(|entry| {
            values.push(entry.value().unwrap_or_default().to_string());
        })?;
        let use_http_path = config.get_bool("credential.useHttpPath").unwrap_or(false);
        Ok(CredentialHelpers::new(values, use_http_path))
    }

    /// The attributes git's credential protocol sends for `url`: protocol,
    /// host (with the port when the URL has one), path (without the leading
    /// slash, only with `useHttpPath`), user name.
    fn attributes(&self, url: &reqwest::Url) -> String {
        let mut text = format!("protocol={}\n", url.scheme());
        if let Some(host) = url.host_str() {
            match url.port() {
                Some(port) => text.push_str(&format!("host={host}:{port}\n")),
                None => text.push_str(&format!("host={host}\n")),
            }
        }
        if self.use_http_path {
            text.push_str(&format!("path={}\n", url.path().trim_start_matches('/')));
        }
        text.push_str(&format!("username={GIT_USER}\n"));
        text
    }

    /// Runs `get` on each helper until one gives a password (or says
    /// `quit`). `Ok(None)`: no helper had one.
    fn fill(
        &self,
        url: &reqwest::Url,
        deadline: Duration,
    ) -> Result<Option<Secret>, TransportError> {
        let input = self.attributes(url);
        let mut notes = Vec::new();
        for cmd in &self.commands {
            let out = run_helper(cmd, "get", &input, deadline)?;
            if let Some(note) = out.stderr_note {
                notes.push(note);
            }
            if let Some(password) = out.password {
                return Ok(Some(password));
            }
            if out.quit {
                break;
            }
        }
        if !notes.is_empty() {
            return Err(TransportError::NoCredential {
                url: url.to_string(),
                detail: format!(": {}", notes.join("; ")),
            });
        }
        Ok(None)
    }

    /// Runs `erase` on each helper with the rejected password, so that a
    /// helper that caches drops it. Failures are only logged.
    fn reject(&self, url: &reqwest::Url, password: &Secret, deadline: Duration) {
        let input = format!("{}password={}\n", self.attributes(url), password.expose());
        for cmd in &self.commands {
            if let Err(e) = run_helper(cmd, "erase", &input, deadline) {
                tracing::warn!(url = %url, error = %e, "credential helper erase failed");
            }
        }
    }
}

struct HelperOutput {
    password: Option<Secret>,
    quit: bool,
    stderr_note: Option<String>,
}

/// Runs `sh -c '<cmd> <action>'` with `input` on stdin, bounded by
/// `deadline` (then killed). The output is parsed as git's credential
/// protocol; stderr is kept (one line, cleaned) for error messages: our own
/// helper never prints a secret there.
fn run_helper(
    cmd: &str,
    action: &str,
    input: &str,
    deadline: Duration,
) -> Result<HelperOutput, TransportError> {
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(format!("{cmd} {action}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // From a thread that acts as the agent user, the helper is wholly that
    // user: with root left as its real uid, the shell would take it back.
    // SAFETY: raw identity system calls only, nothing allocates between
    // fork and exec.
    unsafe {
        command.pre_exec(crate::agent_user::settle_acting_user_in_child);
    }
    let mut child = command
        .spawn()
        .map_err(|e| TransportError::Helper(format!("cannot start the credential helper: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A helper that does not read its input is fine (git ignores it too).
        let _ = stdin.write_all(input.as_bytes());
    }
    let stdout = child
        .stdout
        .take()
        .map(|s| std::thread::spawn(move || read_capped(s)));
    let stderr = child
        .stderr
        .take()
        .map(|s| std::thread::spawn(move || read_capped(s)));
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(TransportError::Helper(format!(
                    "the credential helper did not answer within {} s",
                    deadline.as_secs()
                )));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => {
                return Err(TransportError::Helper(format!(
                    "cannot wait for the credential helper: {e}"
                )));
            }
        }
    };
    let out = stdout.and_then(|t| t.join().ok()).unwrap_or_default();
    let err = stderr.and_then(|t| t.join().ok()).unwrap_or_default();
    let stderr_note = clean_line(&String::from_utf8_lossy(&err));
    if !status.success() {
        // git ignores a failing helper and goes on with the next one.
        tracing::warn!(action, %status, stderr = stderr_note.as_deref().unwrap_or(""), "credential helper failed");
        return Ok(HelperOutput {
            password: None,
            quit: false,
            stderr_note: Some(
                stderr_note
                    .unwrap_or_else(|| format!("the credential helper exited with {status}")),
            ),
        });
    }
    let text = String::from_utf8_lossy(&out);
    let mut password = None;
    let mut quit = false;
    for line in text.lines() {
        match line.split_once('=') {
            Some(("password", p)) if !p.is_empty() => password = Some(Secret::new(p.to_string())),
            Some(("quit", v)) => quit = matches!(v, "1" | "true" | "yes" | "on"),
            _ => {}
        }
    }
    Ok(HelperOutput {
        password,
        quit,
        stderr_note,
    })
}

fn read_capped(mut source: impl Read) -> Vec<u8> {
    let mut buf = Vec::new();
    let _ = source.by_ref().take(64 * 1024).read_to_end(&mut buf);
    // Drain the rest so the helper never blocks on a full pipe.
    let _ = io::copy(&mut source, &mut io::sink());
    buf
}

/// The last non-empty line of `text`, without control characters (NUL
/// included: libgit2 messages are C strings), at most 300 characters.
fn clean_line(text: &str) -> Option<String> {
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
    let clean: String = line.chars().filter(|c| !c.is_control()).collect();
    Some(crate::text::head(&clean, 300).trim().to_string())
}

/// Why a transport step failed. Never holds a credential.
#[derive(Debug, thiserror::Error)]
enum TransportError {
    #[error("no HTTP context is registered for the git remote {0}")]
    Unregistered(String),
    #[error("{0}")]
    Helper(String),
    #[error("the repository's credential helper gave no credentials for {url}{detail}")]
    NoCredential { url: String, detail: String },
    #[error("{REFUSED_TWICE} ({url})")]
    RefusedTwice { url: String },
    #[error("the git server answered HTTP {status} for {url}: {what}")]
    Status {
        status: u16,
        url: String,
        what: String,
    },
    #[error("the server at {url} does not speak git smart HTTP (Content-Type {content_type:?})")]
    NotSmart { url: String, content_type: String },
    #[error("git request to {url} failed: {reason}")]
    Http { url: String, reason: String },
    /// Not retried: a configuration error (PROTOCOL.md 2).
    #[error(
        "the git server at {at} answered the TLS handshake in plain HTTP ({url}): the URL says https:// but the server there speaks http; use an http:// git base URL (HOSTED_BOOT_GIT_BASE_URL, or the session's clone URL), or serve TLS there"
    )]
    PlainHttp { url: String, at: String },
    #[error("invalid git URL {url} ({reason})")]
    InvalidUrl { url: String, reason: String },
}

impl TransportError {
    /// Whether the retry rule retries it (PROTOCOL.md section 2): no
    /// response or a failed body (`Http`), `429`, `5xx`.
    fn is_transient(&self) -> bool {
        match self {
            TransportError::Http { .. } => true,
            TransportError::Status { status, .. } => {
                crate::client::retry::retryable_status(*status)
            }
            _ => false,
        }
    }

    fn into_git(self) -> git2::Error {
        let code = match &self {
            TransportError::RefusedTwice { .. } | TransportError::NoCredential { .. } => {
                ErrorCode::Auth
            }
            TransportError::Status { status: 404, .. } => ErrorCode::NotFound,
            TransportError::Status {
                status: 401 | 403, ..
            } => ErrorCode::Auth,
            TransportError::Unregistered(_)
            | TransportError::Helper(_)
            | TransportError::Status { .. }
            | TransportError::NotSmart { .. }
            | TransportError::Http { .. }
            | TransportError::PlainHttp { .. }
            | TransportError::InvalidUrl { .. } => ErrorCode::GenericError,
        };
        git2::Error::new(code, ErrorClass::Http, self.to_string().replace('\0', ""))
    }

    fn into_io(self) -> io::Error {
        io::Error::other(self.to_string().replace('\0', ""))
    }
}

/// One registered remote.
struct RemoteEntry {
    id: u64,
    http: HttpContext,
    helpers: CredentialHelpers,
    /// Set when a request of this registration failed in a way the retry
    /// rule retries (no response, reset, timeout, stall, `429`, `5xx`).
    transient: Arc<AtomicBool>,
    /// The `Retry-After` of the last `429`/`503`.
    retry_after: Arc<Mutex<Option<Duration>>>,
}

fn registry() -> MutexGuard<'static, HashMap<String, Arc<RemoteEntry>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Arc<RemoteEntry>>>> = OnceLock::new();
    crate::concurrency::lock(REGISTRY.get_or_init(Default::default))
}

fn key(url: &str) -> String {
    url.trim_end_matches('/').to_string()
}

/// Keeps a remote registered; dropping it removes the registration (unless
/// a newer registration of the same URL replaced it).
#[derive(Debug)]
pub struct RemoteRegistration {
    url: String,
    id: u64,
    transient: Arc<AtomicBool>,
    retry_after: Arc<Mutex<Option<Duration>>>,
}

impl RemoteRegistration {
    /// Whether a request through this registration failed in a way the
    /// retry rule of PROTOCOL.md section 2 retries: no HTTP response
    /// (connect error, reset, timeout), a stalled body, `429` or a `5xx`.
    /// libgit2 reports every transport failure with the same code, so this
    /// is how a caller tells a failed git operation worth repeating from a
    /// verdict (credentials refused, no such repository, a `4xx`).
    pub fn saw_transient_failure(&self) -> bool {
        self.transient.load(Ordering::SeqCst)
    }

    /// The `Retry-After` of the last `429` or `503` through this
    /// registration, which replaces the backoff (PROTOCOL.md section 2).
    pub fn retry_after(&self) -> Option<Duration> {
        *crate::concurrency::lock(&self.retry_after)
    }
}

impl Drop for RemoteRegistration {
    fn drop(&mut self) {
        let mut map = registry();
        if map.get(&self.url).is_some_and(|e| e.id == self.id) {
            map.remove(&self.url);
        }
    }
}

/// Routes git2's HTTP(S) traffic for `url` (exactly as configured on the
/// remote) through `http`, with credentials from `helpers`. Installs the
/// transport for `http` and `https` first (once per process).
///
/// Errors: the transport cannot be installed (libgit2 refused the
/// registration).
pub fn register_remote(
    url: &str,
    http: HttpContext,
    helpers: CredentialHelpers,
) -> Result<RemoteRegistration, git2::Error> {
    install()?;
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    let url = key(url);
    let transient = Arc::new(AtomicBool::new(false));
    let retry_after = Arc::new(Mutex::new(None));
    registry().insert(
        url.clone(),
        Arc::new(RemoteEntry {
            id,
            http,
            helpers,
            transient: transient.clone(),
            retry_after: retry_after.clone(),
        }),
    );
    Ok(RemoteRegistration {
        url,
        id,
        transient,
        retry_after,
    })
}

/// Installs the subtransport for `http://` and `https://` URLs, once per
/// process, and sets libgit2's server timeouts (10 s connect, 60 s I/O; they
/// bound libgit2's own socket transports, ours has its own timeouts).
///
/// Every git2 network operation of this crate calls this first (through
/// [`register_remote`]).
///
/// Errors: libgit2 refused the registration (the same error every call).
pub fn install() -> Result<(), git2::Error> {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    let result = INSTALLED.get_or_init(|| {
        // SAFETY: `git2::transport::register` is unsafe because libgit2's
        // list of custom transports is not locked: a registration must not
        // race with the creation of a transport. It runs here exactly once
        // per process (the `OnceLock` makes concurrent callers wait), and
        // every network operation of this crate goes through
        // `register_remote`, which calls `install` before it returns, so no
        // transport of ours is created while the list changes. The factory
        // is `'static + Send + Sync` and the registration is never undone,
        // so libgit2's pointer to it stays valid for the process's life.
        // The two timeout setters write libgit2 globals that are read when
        // a built-in socket connects; setting them once here, before any
        // such connection of ours, is the same synchronization argument.
        unsafe {
            git2::transport::register("http", factory).map_err(|e| e.message().to_string())?;
            git2::transport::register("https", factory).map_err(|e| e.message().to_string())?;
            let _ = git2::opts::set_server_connect_timeout_in_milliseconds(10_000);
            let _ = git2::opts::set_server_timeout_in_milliseconds(60_000);
        }
        Ok(())
    });
    result
        .clone()
        .map_err(|message| git2::Error::new(ErrorCode::GenericError, ErrorClass::Net, message))
}

fn factory(remote: &git2::Remote<'_>) -> Result<Transport, git2::Error> {
    Transport::smart(remote, true, HttpSubtransport::default())
}

/// Credentials state of one connection (one clone, fetch or push).
#[derive(Default)]
struct AuthState {
    password: Option<Secret>,
    attempts: u32,
}

#[derive(Default)]
struct HttpSubtransport {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    entry: Mutex<Option<Arc<RemoteEntry>>>,
    auth: Mutex<AuthState>,
}

impl Shared {
    fn entry(&self, url: &str) -> Result<Arc<RemoteEntry>, TransportError> {
        let mut slot = crate::concurrency::lock(&self.entry);
        if let Some(entry) = slot.as_ref() {
            return Ok(entry.clone());
        }
        let entry = registry()
            .get(&key(url))
            .cloned()
            .ok_or_else(|| TransportError::Unregistered(url.to_string()))?;
        *slot = Some(entry.clone());
        Ok(entry)
    }

    /// The current password, running the helper's `get` (or asking the
    /// broker for `access`) when there is none.
    fn password(
        &self,
        entry: &RemoteEntry,
        url: &reqwest::Url,
        access: crate::wire::Access,
    ) -> Result<Secret, TransportError> {
        let mut auth = crate::concurrency::lock(&self.auth);
        if let Some(p) = &auth.password {
            return Ok(p.clone());
        }
        if auth.attempts >= MAX_CREDENTIAL_ATTEMPTS {
            return Err(TransportError::RefusedTwice {
                url: url.to_string(),
            });
        }
        auth.attempts += 1;
        let filled = match &entry.http.broker {
            Some(broker) => broker_fill(broker, &entry.http, url, access)?,
            None => entry.helpers.fill(url, helper_deadline(&entry.http))?,
        };
        match filled {
            Some(p) => {
                entry.http.redactor.add(&p, SecretKind::Credential);
                auth.password = Some(p.clone());
                Ok(p)
            }
            None => Err(TransportError::NoCredential {
                url: url.to_string(),
                detail: String::new(),
            }),
        }
    }

    /// A `401` for `password`: erase it from the helpers and forget it.
    /// Returns whether another attempt is allowed.
    fn rejected(&self, entry: &RemoteEntry, url: &reqwest::Url, password: &Secret) -> bool {
        let mut auth = crate::concurrency::lock(&self.auth);
        match &entry.http.broker {
            Some(broker) => entry
                .http
                .runtime
                .block_on(broker.erase(Some(password.expose()))),
            None => entry
                .helpers
                .reject(url, password, helper_deadline(&entry.http)),
        }
        if auth.password.as_ref() == Some(password) {
            auth.password = None;
        }
        auth.attempts < MAX_CREDENTIAL_ATTEMPTS
    }
}

/// A token from the broker for the session's remote (`None` for any other
/// URL, as a helper that knows nothing of it). Runs on the thread libgit2
/// calls us on (see the module's threading note).
fn broker_fill(
    broker: &super::Broker,
    http: &HttpContext,
    url: &reqwest::Url,
    access: crate::wire::Access,
) -> Result<Option<Secret>, TransportError> {
    if !broker.is_session_remote(url) {
        return Ok(None);
    }
    let handed =
        http.runtime
            .block_on(broker.token(access))
            .map_err(|e| TransportError::NoCredential {
                url: url.to_string(),
                detail: format!(": {e}"),
            })?;
    tracing::debug!(
        url = %url,
        ?access,
        source = ?handed.source,
        "credential broker gave the runner's transport a repo token"
    );
    Ok(Some(handed.token))
}

/// How long a helper may take: its own calls are bounded (3 attempts of at
/// most one request timeout each, plus waits, for two calls), so twelve
/// request timeouts (two minutes by default) is a generous bound.
fn helper_deadline(http: &HttpContext) -> Duration {
    http.request_timeout.saturating_mul(12)
}

impl SmartSubtransport for HttpSubtransport {
    fn action(
        &self,
        url: &str,
        action: Service,
    ) -> Result<Box<dyn SmartSubtransportStream>, git2::Error> {
        let entry = self.shared.entry(url).map_err(TransportError::into_git)?;
        let base = url.trim_end_matches('/');
        let (service, post) = match action {
            Service::UploadPackLs => ("git-upload-pack", false),
            Service::UploadPack => ("git-upload-pack", true),
            Service::ReceivePackLs => ("git-receive-pack", false),
            Service::ReceivePack => ("git-receive-pack", true),
        };
        let target = if post {
            format!("{base}/{service}")
        } else {
            format!("{base}/info/refs?service={service}")
        };
        let target = reqwest::Url::parse(&target).map_err(|e| {
            git2::Error::new(
                ErrorCode::GenericError,
                ErrorClass::Http,
                format!("invalid git URL {url}: {e}"),
            )
        })?;
        let mut stream = HttpStream {
            shared: self.shared.clone(),
            entry,
            remote: url.to_string(),
            target,
            service,
            post,
            request: Vec::new(),
            response: None,
            pending: Bytes::new(),
            finished: false,
        };
        if !post {
            // The advertisement is a GET: send it now, so that its errors
            // (authentication included) come back with their git2 code.
            stream.send().map_err(TransportError::into_git)?;
        }
        Ok(Box::new(stream))
    }

    fn close(&self) -> Result<(), git2::Error> {
        Ok(())
    }
}

/// One request/response exchange. A POST collects libgit2's writes and is
/// sent on the first read (stateless RPC: libgit2 writes the whole request,
/// then reads the whole answer).
struct HttpStream {
    shared: Arc<Shared>,
    entry: Arc<RemoteEntry>,
    /// The remote URL (credential lookup, messages).
    remote: String,
    target: reqwest::Url,
    service: &'static str,
    post: bool,
    request: Vec<u8>,
    response: Option<reqwest::Response>,
    pending: Bytes,
    finished: bool,
}

impl HttpStream {
    /// Notes a failure on the registration (see
    /// [`RemoteRegistration::saw_transient_failure`]) and passes it on.
    fn failed(&self, e: TransportError) -> TransportError {
        if e.is_transient() {
            self.entry.transient.store(true, Ordering::SeqCst);
        }
        e
    }

    fn build(&self, password: &Secret) -> reqwest::RequestBuilder {
        let client = &self.entry.http.client;
        let builder = if self.post {
            client
                .post(self.target.clone())
                .header(
                    reqwest::header::CONTENT_TYPE,
                    format!("application/x-{}-request", self.service),
                )
                .header(
                    reqwest::header::ACCEPT,
                    format!("application/x-{}-result", self.service),
                )
                .body(self.request.clone())
        } else {
            client.get(self.target.clone()).header("Pragma", "no-cache")
        };
        builder
            .header(
                reqwest::header::USER_AGENT,
                concat!("git/2.0 (hosted-boot/", env!("CARGO_PKG_VERSION"), ")"),
            )
            .basic_auth(GIT_USER, Some(password.expose()))
    }

    /// Sends the request with credentials (at most two attempts in all for
    /// the connection) and checks the answer.
    fn send(&mut self) -> Result<(), TransportError> {
        self.try_send().map_err(|e| self.failed(e))
    }

    fn try_send(&mut self) -> Result<(), TransportError> {
        let remote_url =
            reqwest::Url::parse(&self.remote).map_err(|e| TransportError::InvalidUrl {
                url: self.remote.clone(),
                reason: e.to_string(),
            })?;
        loop {
            // git's receive-pack (a push) needs write access; everything
            // else reads.
            let access = if self.service == "git-receive-pack" {
                crate::wire::Access::Write
            } else {
                crate::wire::Access::Read
            };
            let password = self.shared.password(&self.entry, &remote_url, access)?;
            let request = self.build(&password);
            if access == crate::wire::Access::Write {
                crate::telemetry::metrics::pushed(self.request.len() as u64);
            }
            let timeout = self.entry.http.request_timeout;
            let sent = self
                .entry
                .http
                .runtime
                .block_on(async { tokio::time::timeout(timeout, request.send()).await });
            let response = match sent {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    if let Some(at) = crate::client::retry::plain_http_answer(&e) {
                        return Err(TransportError::PlainHttp {
                            url: self.remote.clone(),
                            at,
                        });
                    }
                    return Err(TransportError::Http {
                        url: self.remote.clone(),
                        reason: crate::client::retry::describe(e),
                    });
                }
                Err(_) => {
                    return Err(TransportError::Http {
                        url: self.remote.clone(),
                        reason: format!("no answer within {} ms", timeout.as_millis()),
                    });
                }
            };
            let status = response.status();
            if status == StatusCode::UNAUTHORIZED {
                tracing::info!(url = %self.remote, "git server refused the credentials (401)");
                if self.shared.rejected(&self.entry, &remote_url, &password) {
                    continue;
                }
                return Err(TransportError::RefusedTwice {
                    url: self.remote.clone(),
                });
            }
            if !status.is_success() {
                if crate::client::retry::honours_retry_after(status.as_u16())
                    && let Some(wait) = crate::client::retry::retry_after(response.headers())
                {
                    *crate::concurrency::lock(&self.entry.retry_after) = Some(wait);
                }
                return Err(TransportError::Status {
                    status: status.as_u16(),
                    url: self.remote.clone(),
                    what: describe_status(status).to_string(),
                });
            }
            let expected = if self.post {
                format!("application/x-{}-result", self.service)
            } else {
                format!("application/x-{}-advertisement", self.service)
            };
            let content_type = response
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let media_type = content_type.split(';').next().unwrap_or("").trim();
            if !media_type.eq_ignore_ascii_case(&expected) {
                return Err(TransportError::NotSmart {
                    url: self.remote.clone(),
                    content_type,
                });
            }
            self.response = Some(response);
            return Ok(());
        }
    }
}

fn describe_status(status: StatusCode) -> &'static str {
    match status.as_u16() {
        300..=399 => "a redirect, which is never followed",
        403 => "access refused: the token does not allow this operation",
        404 => "no such repository",
        429 => "too many requests",
        500..=599 => "server error",
        _ => "unexpected status",
    }
}

impl Read for HttpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.response.is_none() {
            self.send().map_err(TransportError::into_io)?;
        }
        let stall = self
            .entry
            .http
            .stall
            .min(self.entry.http.request_timeout.saturating_mul(6));
        loop {
            if !self.pending.is_empty() {
                let n = buf.len().min(self.pending.len());
                buf[..n].copy_from_slice(&self.pending.split_to(n));
                return Ok(n);
            }
            if self.finished || buf.is_empty() {
                return Ok(0);
            }
            let Some(response) = self.response.as_mut() else {
                return Ok(0);
            };
            let chunk = self
                .entry
                .http
                .runtime
                .block_on(async { tokio::time::timeout(stall, response.chunk()).await });
            match chunk {
                Ok(Ok(Some(bytes))) => self.pending = bytes,
                Ok(Ok(None)) => self.finished = true,
                Ok(Err(e)) => {
                    let e = TransportError::Http {
                        url: self.remote.clone(),
                        reason: crate::client::retry::describe(e),
                    };
                    return Err(self.failed(e).into_io());
                }
                Err(_) => {
                    let e = TransportError::Http {
                        url: self.remote.clone(),
                        reason: format!(
                            "the transfer stalled: no byte for {} ms",
                            stall.as_millis()
                        ),
                    };
                    return Err(self.failed(e).into_io());
                }
            }
        }
    }
}

impl Write for HttpStream {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if !self.post || self.response.is_some() {
            return Err(io::Error::other(
                "git transport: write after the request was sent",
            ));
        }
        self.request.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helper_values_resolve_like_git() {
        let h = CredentialHelpers::new(
            ["store", "", "!'/bin/x' credential", "/abs/helper", "cache"],
            true,
        );
        assert_eq!(
            h.commands,
            &["'/bin/x' credential", "/abs/helper", "git credential-cache"]
        );
    }

    #[test]
    fn attributes_follow_git() {
        let h = CredentialHelpers::new(["!x"], true);
        let url = reqwest::Url::parse("http://127.0.0.1:8080/git/o/r.git").unwrap();
        assert_eq!(
            h.attributes(&url),
            "protocol=http\nhost=127.0.0.1:8080\npath=git/o/r.git\nusername=x-access-token\n"
        );
        let h = CredentialHelpers::new(["!x"], false);
        let url = reqwest::Url::parse("https://github.com/o/r.git").unwrap();
        assert_eq!(
            h.attributes(&url),
            "protocol=https\nhost=github.com\nusername=x-access-token\n"
        );
    }

    #[test]
    fn helper_output_is_parsed_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("h.sh");
        std::fs::write(
            &script,
            "#!/bin/sh\ncat >/dev/null\necho username=x-access-token\necho password=tok-123\necho note >&2\n",
        )
        .unwrap();
        let out = run_helper(
            &format!("sh '{}'", script.display()),
            "get",
            "protocol=http\n",
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(out.password.unwrap().expose(), "tok-123");
        assert!(!out.quit);
        let out = run_helper("echo quit=1; true", "get", "", Duration::from_secs(5)).unwrap();
        assert!(out.quit && out.password.is_none());
        let err = run_helper("sleep 5;", "get", "", Duration::from_millis(200))
            .err()
            .unwrap();
        assert!(err.to_string().contains("did not answer"), "{err}");
    }

    #[test]
    fn clean_line_strips_controls() {
        assert_eq!(
            clean_line("a\nbad\0 thing\x07\n\n").as_deref(),
            Some("bad thing")
        );
        assert_eq!(clean_line("\n  \n"), None);
    }
}
