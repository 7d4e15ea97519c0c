//! The credential broker (PROTOCOL.md section 3, 2.5): the runner's own
//! source of repo tokens in broker mode, for its transport (in process) and
//! for git's credential helper (`hosted-boot credential`, over a Unix
//! socket in the session directory). The boot secret never leaves the
//! runner's memory: the broker mints with the runner's [`Api`].
//!
//! - It answers only for the session's remote (protocol, host and path,
//!   [`request_matches_remote`]): the push policy's "the session's
//!   repository only". Anything else gets an empty answer (git tries its
//!   other helpers).
//! - It mints `write` repo tokens (2.5) and caches one in memory while it is
//!   valid for longer than [`reuse_margin`] (only with an `expiresAt` and not
//!   for an `artifactsRemote`, as section 3 allows). One mint at a time:
//!   concurrent requests wait for it and share its token.
//! - The boot's own `read` token (step 3) seeds a read slot that only the
//!   runner's fetches and clone use, so the clone mints nothing.
//! - Every token it hands out is added to the runner's redactor before the
//!   answer is sent, and each answer is logged without the value.
//! - Peers are admitted by `SO_PEERCRED`: only the uids given to
//!   [`Broker::serve`]; any other is answered `quit=1` and logged.
//!
//! The socket protocol: the client sends the action (`get` or `erase`) on
//! the first line, then git's `key=value` lines, then a blank line (or
//! closes its writing half); at most [`MAX_REQUEST_BYTES`], within the read
//! timeout. The broker answers git's lines (`username`, `password`, or
//! `quit=1` with a `hosted-boot-reason=…` line the helper prints on stderr)
//! and closes the connection.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reqwest::Url;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use super::credential::{CachedToken, read_attributes, request_matches_remote, reuse_margin};
use super::transport::GIT_USER;
use crate::client::{Api, Policy, RepoToken};
use crate::redact::{Redactor, SecretKind};
use crate::secret::Secret;
use crate::wire::Access;

/// Longest request the broker reads from a client (git's attributes are a
/// few hundred bytes).
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// Longest answer the helper reads from the broker.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// Connections served at once; more wait in the listen backlog, so a flood
/// of clients cannot grow the runner's memory.
const MAX_CONNECTIONS: usize = 32;

/// The answer line that carries a refusal's reason (never a secret) for the
/// helper's stderr; git never sees it.
pub const REASON_KEY: &str = "hosted-boot-reason";

/// Why the broker could not give a token. The text never holds a secret
/// (a mint's error is redacted).
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The coordinator did not mint one.
    #[error("cannot mint a repo token: {0}")]
    Mint(String),
    /// The token cannot travel in git's line protocol.
    #[error("the repo token holds a line break or NUL; refusing it")]
    BadToken,
}

/// Where a handed-out token came from (logged with each answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenSource {
    /// The cached `write` token.
    Cached,
    /// Minted for this request.
    Minted,
    /// The boot's own `read` token (PROTOCOL.md 4 step 3).
    Seeded,
}

impl TokenSource {
    fn name(self) -> &'static str {
        match self {
            TokenSource::Cached => "cached",
            TokenSource::Minted => "minted",
            TokenSource::Seeded => "seeded",
        }
    }
}

/// A token the broker hands out, already known to the redactor.
#[derive(Clone, Debug)]
pub struct Handed {
    /// The repo token.
    pub token: Secret,
    /// Cached, minted or seeded.
    pub source: TokenSource,
    /// Its expiry, when the coordinator gave one.
    pub expires_at: Option<SystemTime>,
}

/// The broker; cheap to clone (one shared state).
#[derive(Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

struct Inner {
    api: Arc<Api>,
    remote: Url,
    redactor: Redactor,
    /// The cached `write` token; the lock is held across a mint, so there is
    /// one mint in flight at most.
    write: tokio::sync::Mutex<Option<CachedToken>>,
    /// The boot's `read` token, for the runner's own fetches.
    read: std::sync::Mutex<Option<CachedToken>>,
    /// Submodule remotes on the session's host the clone met
    /// ([`Broker::allow_submodule_remote`]): answered like the session's.
    submodule_remotes: std::sync::Mutex<Vec<Url>>,
    /// Whether the socket answers ([`Broker::open_socket`]): during a turn
    /// and the clone's completion only. Between turns nothing of the agent should
    /// need a repo token, and a CLI started ahead of its turn (with the
    /// MCP servers and hooks the repository configures) must get none.
    turn: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("remote", &self.inner.remote.as_str())
            .finish_non_exhaustive()
    }
}

/// A cached token is answered while it is valid for longer than its reuse
/// margin (the file helper's rule, PROTOCOL.md 3).
fn fresh(cached: &CachedToken) -> bool {
    cached.expires_at > SystemTime::now() + reuse_margin(cached)
}

/// The cache entry for `token` minted at `issued_at`, when section 3
/// allows it to be cached (an `expiresAt`, not an `artifactsRemote`).
fn cacheable(token: &RepoToken, issued_at: SystemTime) -> Option<CachedToken> {
    if token.artifacts_remote.is_some() {
        return None;
    }
    Some(CachedToken {
        token: token.token.clone(),
        expires_at: token.expires_at?,
        issued_at: Some(issued_at),
    })
}

fn line_safe(token: &Secret) -> bool {
    !token
        .expose()
        .bytes()
        .any(|b| b == b'\n' || b == b'\r' || b == 0)
}

impl Broker {
    /// A broker for `remote` (the clone URL, 2.5) that mints with `api` (the
    /// runner's client, holding the boot secret) and registers every token
    /// with `redactor`.
    pub fn new(api: Arc<Api>, remote: Url, redactor: Redactor) -> Broker {
        Broker {
            inner: Arc::new(Inner {
                api,
                remote,
                redactor,
                write: tokio::sync::Mutex::new(None),
                read: std::sync::Mutex::new(None),
                submodule_remotes: std::sync::Mutex::new(Vec::new()),
                turn: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// Opens the socket (`true`) or closes it (`false`): open while a turn's
    /// token is written (the agent's git) and while the boot completes a
    /// fresh clone (the `git` commands that fetch its submodules and LFS
    /// objects ask through it); closed otherwise. The runner's own git work
    /// asks the broker in process, whatever this.
    pub fn open_socket(&self, open: bool) {
        self.inner
            .turn
            .store(open, std::sync::atomic::Ordering::SeqCst);
    }

    /// The session's remote.
    pub fn remote(&self) -> &Url {
        &self.inner.remote
    }

    /// Seeds the read slot with the boot's `read` token (minted at
    /// `issued_at`), when section 3 allows it to be cached; returns whether
    /// it did. Only the runner's own fetches use it (git's helper does not
    /// say whether it fetches or pushes, so it always gets a `write` token).
    pub fn seed_read(&self, token: &RepoToken, issued_at: SystemTime) -> bool {
        let Some(entry) = cacheable(token, issued_at).filter(|e| line_safe(&e.token)) else {
            return false;
        };
        self.inner
            .redactor
            .add(&entry.token, SecretKind::Credential);
        *crate::concurrency::lock(&self.inner.read) = Some(entry);
        true
    }

    /// Lets git's helper requests for `url` (a submodule's repository on the
    /// session's host, met by the clone: PROTOCOL.md 3, "A complete
    /// workspace") be answered with the session's repo token, for the rest
    /// of the boot.
    pub fn allow_submodule_remote(&self, url: &Url) {
        let mut remotes = crate::concurrency::lock(&self.inner.submodule_remotes);
        if !remotes.contains(url) {
            tracing::info!(remote = %url, "credential broker: answers for a submodule's remote too");
            remotes.push(url.clone());
        }
    }

    /// Whether `url` is the session's remote (the check of git's requests,
    /// applied to the runner's own URLs).
    pub fn is_session_remote(&self, url: &Url) -> bool {
        let mut attributes = HashMap::new();
        attributes.insert("protocol".to_string(), url.scheme().to_string());
        if let Some(host) = url.host_str() {
            let host = match url.port() {
                Some(port) => format!("{host}:{port}"),
                None => host.to_string(),
            };
            attributes.insert("host".to_string(), host);
        }
        attributes.insert("path".to_string(), url.path().to_string());
        request_matches_remote(&attributes, &self.inner.remote)
    }

    /// A token for `access`, registered with the redactor before it is
    /// returned: for `Read` the cached write token or the seeded read token
    /// while fresh; otherwise the cached write token while fresh, else a
    /// new one (one mint in flight; concurrent callers share its token).
    ///
    /// Errors: [`BrokerError`] (redacted text).
    pub async fn token(&self, access: Access) -> Result<Handed, BrokerError> {
        if access == Access::Read {
            // A mint in flight holds the write slot: a fetch does not wait
            // for it when the boot's read token is still good.
            let cached = self
                .inner
                .write
                .try_lock()
                .ok()
                .and_then(|slot| slot.as_ref().filter(|c| fresh(c)).cloned());
            let seeded = crate::concurrency::lock(&self.inner.read)
                .as_ref()
                .filter(|c| fresh(c))
                .cloned();
            let found = match (cached, seeded) {
                (Some(c), _) => Some((c, TokenSource::Cached)),
                (None, Some(s)) => Some((s, TokenSource::Seeded)),
                (None, None) => None,
            };
            if let Some((entry, source)) = found {
                self.inner
                    .redactor
                    .add(&entry.token, SecretKind::Credential);
                return Ok(Handed {
                    token: entry.token,
                    source,
                    expires_at: Some(entry.expires_at),
                });
            }
        }
        self.write_token().await
    }

    async fn write_token(&self) -> Result<Handed, BrokerError> {
        let mut slot = self.inner.write.lock().await;
        if let Some(cached) = slot.as_ref().filter(|c| fresh(c)) {
            self.inner
                .redactor
                .add(&cached.token, SecretKind::Credential);
            return Ok(Handed {
                token: cached.token.clone(),
                source: TokenSource::Cached,
                expires_at: Some(cached.expires_at),
            });
        }
        let issued_at = SystemTime::now();
        let minted = self
            .inner
            .api
            .repo_token(Access::Write, Policy::CREDENTIAL_HELPER)
            .await
            .map_err(|e| BrokerError::Mint(self.inner.redactor.redact(&e.to_string())))?;
        // Added before anything else sees it (the client's mint adds it too).
        self.inner
            .redactor
            .add(&minted.token, SecretKind::Credential);
        if !line_safe(&minted.token) {
            return Err(BrokerError::BadToken);
        }
        *slot = cacheable(&minted, issued_at);
        tracing::info!(
            remote = %self.inner.remote,
            expires_at = %minted.expires_at.map(|t| humantime::format_rfc3339_seconds(t).to_string()).unwrap_or_else(|| "unknown".into()),
            cached = slot.is_some(),
            "credential broker minted a repo token"
        );
        Ok(Handed {
            token: minted.token,
            source: TokenSource::Minted,
            expires_at: minted.expires_at,
        })
    }

    /// git refused `refused` (or a token it did not name): drops the cached
    /// and seeded tokens that are the refused one, so the next request
    /// mints. A different cached token (a concurrent request's new one)
    /// stays.
    pub async fn erase(&self, refused: Option<&str>) {
        let is_refused = |c: &Option<CachedToken>| {
            c.as_ref()
                .is_some_and(|c| refused.is_none_or(|r| r == c.token.expose()))
        };
        {
            let mut read = crate::concurrency::lock(&self.inner.read);
            if is_refused(&read) {
                *read = None;
            }
        }
        let mut write = self.inner.write.lock().await;
        if is_refused(&write) {
            *write = None;
            tracing::info!(remote = %self.inner.remote, "credential broker dropped a refused repo token");
        }
    }

    /// The answer to one socket request from a peer of uid `uid`.
    async fn answer(&self, request: &[u8], uid: u32) -> Secret {
        let (action, rest) = match request.iter().position(|&b| b == b'\n') {
            Some(end) => request.split_at(end),
            None => (request, &[][..]),
        };
        let action = String::from_utf8_lossy(action).trim().to_string();
        let attributes = read_attributes(rest.strip_prefix(b"\n").unwrap_or(rest));
        let describe = |key: &str| attributes.get(key).cloned().unwrap_or_default();
        let submodule = crate::concurrency::lock(&self.inner.submodule_remotes)
            .iter()
            .any(|u| request_matches_remote(&attributes, u));
        if !submodule && !request_matches_remote(&attributes, &self.inner.remote) {
            tracing::info!(
                action,
                uid,
                protocol = describe("protocol"),
                host = describe("host"),
                path = describe("path"),
                "credential broker: not the session's remote; nothing answered"
            );
            return Secret::new(String::new());
        }
        match action.as_str() {
            "get" => match self.token(Access::Write).await {
                Ok(handed) => {
                    tracing::info!(
                        remote = %self.inner.remote,
                        uid,
                        source = handed.source.name(),
                        expires_at = %handed.expires_at.map(|t| humantime::format_rfc3339_seconds(t).to_string()).unwrap_or_else(|| "unknown".into()),
                        "credential broker answered"
                    );
                    Secret::new(format!(
                        "username={GIT_USER}\npassword={}\n",
                        handed.token.expose()
                    ))
                }
                Err(e) => {
                    tracing::warn!(remote = %self.inner.remote, uid, error = %e, "credential broker has no token");
                    quit(&e.to_string())
                }
            },
            "erase" => {
                self.erase(attributes.get("password").map(String::as_str))
                    .await;
                Secret::new(String::new())
            }
            // `store` and any other action: nothing to do, as git asks.
            _ => Secret::new(String::new()),
        }
    }

    /// Binds the broker's socket at `path` (mode 0666: the uid check is the
    /// guard, so that an allowed uid other than the runner's can connect)
    /// and serves it until the returned [`BrokerServer`] is dropped. Peers
    /// whose uid is not in `allowed_uids` are refused; a client that sends
    /// no complete request within `read_timeout` is dropped.
    ///
    /// Errors: the socket cannot be bound or its mode set.
    pub fn serve(
        &self,
        path: &Path,
        allowed_uids: Vec<u32>,
        read_timeout: Duration,
    ) -> std::io::Result<BrokerServer> {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(super::socket_path::SocketPath::new(path)?.as_path())?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
        let broker = self.clone();
        let allowed: Arc<[u32]> = allowed_uids.into();
        tracing::info!(socket = %path.display(), allowed_uids = ?allowed, "credential broker listening");
        let task = tokio::spawn(async move {
            let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
            loop {
                let Ok(permit) = slots.clone().acquire_owned().await else {
                    return;
                };
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!(error = %e, "credential broker: accept failed");
                        continue;
                    }
                };
                let broker = broker.clone();
                let allowed = allowed.clone();
                tokio::spawn(async move {
                    broker.serve_one(stream, &allowed, read_timeout).await;
                    drop(permit);
                });
            }
        });
        Ok(BrokerServer {
            path: path.to_path_buf(),
            task,
        })
    }

    async fn serve_one(&self, mut stream: UnixStream, allowed: &[u32], read_timeout: Duration) {
        let cred = match stream.peer_cred() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "credential broker: cannot read the peer's credentials; refused");
                return;
            }
        };
        let uid = cred.uid();
        let pid = cred.pid();
        // The request is read whoever the peer is: a socket closed with
        // unread data resets the connection, and the peer would lose the
        // refusal's reason.
        let request = match tokio::time::timeout(read_timeout, read_request(&mut stream)).await {
            Ok(request) => request,
            Err(_) => {
                tracing::warn!(
                    uid,
                    pid,
                    "credential broker: no complete request in time; dropped"
                );
                return;
            }
        };
        let answer = if !allowed.contains(&uid) {
            tracing::warn!(uid, pid, allowed_uids = ?allowed, "credential broker refused a peer whose uid is not allowed");
            quit(&format!("the credential broker does not admit uid {uid}"))
        } else if !self.inner.turn.load(std::sync::atomic::Ordering::SeqCst) {
            tracing::warn!(
                uid,
                pid,
                "credential broker refused a request between turns"
            );
            quit(
                "no turn is running: the credential broker answers the agent's git during a turn only",
            )
        } else if let Some(request) = request {
            self.answer(&request, uid).await
        } else {
            tracing::warn!(
                uid,
                pid,
                "credential broker: request too large or unreadable; refused"
            );
            quit("the request is too large or unreadable")
        };
        let _ = tokio::time::timeout(read_timeout, async {
            stream.write_all(answer.expose().as_bytes()).await?;
            stream.shutdown().await
        })
        .await;
    }
}

fn quit(reason: &str) -> Secret {
    let reason = reason.replace(['\n', '\r'], " ");
    Secret::new(format!("quit=1\n{REASON_KEY}={reason}\n"))
}

/// Reads one request: up to a blank line (after the action line) or EOF;
/// `None` past [`MAX_REQUEST_BYTES`] or on a read error.
async fn read_request(stream: &mut UnixStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if buf.windows(2).any(|w| w == b"\n\n") || buf.windows(4).any(|w| w == b"\r\n\r\n") {
            return Some(buf);
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return Some(buf);
        }
        buf.extend_from_slice(chunk.get(..n)?);
        if buf.len() > MAX_REQUEST_BYTES {
            return None;
        }
    }
}

/// The broker's socket being served; dropping it stops the broker and
/// removes the socket.
#[derive(Debug)]
pub struct BrokerServer {
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for BrokerServer {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The helper's side (`hosted-boot credential` in broker mode): sends
/// `action` and git's `attributes` to the broker at `socket` and returns
/// its answer for git (without the reason line) and the reason, if any.
/// `wait` bounds each read and write (the broker may be minting).
///
/// Errors: the broker cannot be reached or did not answer, with a message
/// naming the socket (never a secret).
pub fn relay(
    socket: &Path,
    action: &str,
    attributes: &HashMap<String, String>,
    wait: Duration,
) -> Result<(Secret, Option<String>), String> {
    let unreachable = |e: std::io::Error| {
        format!(
            "cannot reach the credential broker at {} ({e}); has the session ended?",
            socket.display()
        )
    };
    let address = super::socket_path::SocketPath::new(socket).map_err(unreachable)?;
    let mut stream =
        std::os::unix::net::UnixStream::connect(address.as_path()).map_err(unreachable)?;
    stream.set_read_timeout(Some(wait)).map_err(unreachable)?;
    stream.set_write_timeout(Some(wait)).map_err(unreachable)?;
    // Built in one buffer of its final size, zeroized with the Secret (an
    // erase carries the refused password).
    let size = action.len()
        + 2
        + attributes
            .iter()
            .map(|(k, v)| k.len() + v.len() + 2)
            .sum::<usize>();
    let mut text = String::with_capacity(size);
    text.push_str(action);
    text.push('\n');
    for (key, value) in attributes {
        text.push_str(key);
        text.push('=');
        text.push_str(value);
        text.push('\n');
    }
    text.push('\n');
    let request = Secret::new(text);
    stream
        .write_all(request.expose().as_bytes())
        .map_err(unreachable)?;
    drop(request);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut bytes = Vec::new();
    (&mut stream)
        .take(MAX_ANSWER_BYTES as u64)
        .read_to_end(&mut bytes)
        .map_err(|e| {
            format!(
                "the credential broker at {} did not answer ({e})",
                socket.display()
            )
        })?;
    let text = match String::from_utf8(bytes) {
        Ok(t) => Secret::new(t),
        Err(_) => return Err("the credential broker's answer is not UTF-8".to_string()),
    };
    let mut answer = String::new();
    let mut reason = None;
    for line in text.expose().lines() {
        match line.split_once('=') {
            Some((REASON_KEY, r)) => reason = Some(r.to_string()),
            _ => {
                answer.push_str(line);
                answer.push('\n');
            }
        }
    }
    Ok((Secret::new(answer), reason))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::ApiConfig;

    const REMOTE: &str = "http://127.0.0.1:9/git/o/r.git";

    /// A broker whose coordinator is unreachable (port 9): it can only
    /// answer from what it was seeded with.
    fn broker() -> (Broker, Redactor) {
        crate::tls::install_crypto_provider();
        let url = |p: &str| Url::parse(&format!("http://127.0.0.1:9/{p}")).unwrap();
        let redactor = Redactor::new();
        let api = Api::new(
            ApiConfig {
                api_base: url(""),
                agent_token_url: url("t"),
                boot_status_url: url("s"),
                session_id: "s1".into(),
                boot_secret: Secret::new("boot".into()),
            },
            crate::tls::http_client(None).unwrap(),
            crate::timings::Timings::default().scaled(0.01),
            redactor.clone(),
        );
        let broker = Broker::new(Arc::new(api), Url::parse(REMOTE).unwrap(), redactor.clone());
        // As during a turn: the socket answers the agent's git only then.
        broker.open_socket(true);
        (broker, redactor)
    }

    /// Sends `request` whole to the socket at `path`; its answer.
    fn ask(path: &Path, request: &[u8]) -> String {
        let mut s = std::os::unix::net::UnixStream::connect(path).unwrap();
        s.write_all(request).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    fn token(value: &str, ttl: Option<Duration>) -> RepoToken {
        RepoToken {
            token: Secret::new(value.into()),
            expires_at: ttl.map(|t| SystemTime::now() + t),
            repo_full_name: Some("o/r".into()),
            artifacts_remote: None,
        }
    }

    #[tokio::test]
    async fn the_seed_serves_reads_only_while_cacheable_and_fresh() {
        let (b, redactor) = broker();
        let hour = Some(Duration::from_secs(3600));
        assert!(!b.seed_read(&token("no-expiry-token", None), SystemTime::now()));
        let artifacts = RepoToken {
            artifacts_remote: Some("https://x/git/a/b.git".into()),
            ..token("artifacts-token", hour)
        };
        assert!(!b.seed_read(&artifacts, SystemTime::now()));
        assert!(b.seed_read(&token("seeded-token-1", hour), SystemTime::now()));
        let handed = b.token(Access::Read).await.unwrap();
        assert_eq!(handed.token.expose(), "seeded-token-1");
        assert_eq!(handed.source, TokenSource::Seeded);
        assert_eq!(redactor.redact("x seeded-token-1 y"), "x [REDACTED] y");
        // Another token refused: the seed stays; the seed refused: gone.
        b.erase(Some("other")).await;
        assert!(b.token(Access::Read).await.is_ok());
        b.erase(Some("seeded-token-1")).await;
        // Nothing left, and the coordinator is unreachable.
        let err = b.token(Access::Read).await.unwrap_err();
        assert!(matches!(err, BrokerError::Mint(_)), "{err}");
        assert!(!err.to_string().contains("boot"), "{err}");
    }

    #[tokio::test]
    async fn writes_never_use_the_read_seed() {
        let (b, _) = broker();
        assert!(b.seed_read(
            &token("seeded-token-2", Some(Duration::from_secs(3600))),
            SystemTime::now()
        ));
        assert!(b.token(Access::Write).await.is_err());
    }

    #[test]
    fn the_transports_urls_are_checked_like_gits_requests() {
        let (b, _) = broker();
        assert!(b.is_session_remote(&Url::parse(REMOTE).unwrap()));
        assert!(b.is_session_remote(&Url::parse("http://127.0.0.1:9/git/o/r").unwrap()));
        for other in [
            "http://127.0.0.1:10/git/o/r.git",
            "http://127.0.0.2:9/git/o/r.git",
            "https://127.0.0.1:9/git/o/r.git",
            "http://127.0.0.1:9/git/o/other.git",
        ] {
            assert!(!b.is_session_remote(&Url::parse(other).unwrap()), "{other}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_socket_refuses_other_uids_other_remotes_and_floods() {
        let (b, _) = broker();
        assert!(b.seed_read(
            &token("seeded-token-3", Some(Duration::from_secs(3600))),
            SystemTime::now()
        ));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credential.sock");
        let me = rustix::process::getuid().as_raw();
        let ask = |path: PathBuf, request: String| {
            tokio::task::spawn_blocking(move || {
                let mut s = std::os::unix::net::UnixStream::connect(&path).unwrap();
                let _ = s.write_all(request.as_bytes());
                let mut out = String::new();
                let _ = s.read_to_string(&mut out);
                out
            })
        };
        let other_host = "get\nprotocol=http\nhost=evil:9\npath=git/o/r.git\n\n".to_string();
        {
            let _server = b.serve(&path, vec![me], Duration::from_secs(5)).unwrap();
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o666);
            assert_eq!(ask(path.clone(), other_host.clone()).await.unwrap(), "");
            let flood = format!("get\n{}\n", "k=v\n".repeat(MAX_REQUEST_BYTES));
            let out = ask(path.clone(), flood).await.unwrap();
            assert!(!out.contains("password="), "{out}");
            // An erase of another remote does nothing either.
            let erase = other_host.replacen("get", "erase", 1);
            assert_eq!(ask(path.clone(), erase).await.unwrap(), "");
        }
        // Dropped: the socket is gone.
        assert!(!path.exists());
        let _server = b
            .serve(&path, vec![me.wrapping_add(1)], Duration::from_secs(5))
            .unwrap();
        let out = ask(path.clone(), other_host).await.unwrap();
        assert!(out.starts_with("quit=1\n"), "{out}");
        assert!(out.contains(&format!("does not admit uid {me}")), "{out}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stuck_client_neither_holds_the_broker_nor_stays_connected() {
        let (b, _) = broker();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credential.sock");
        let me = rustix::process::getuid().as_raw();
        let _server = b
            .serve(&path, vec![me], Duration::from_millis(200))
            .unwrap();
        let stuck_path = path.clone();
        let stuck = tokio::task::spawn_blocking(move || {
            let mut s = std::os::unix::net::UnixStream::connect(&stuck_path).unwrap();
            // Half a request, never finished.
            s.write_all(b"get\nprotocol=http\n").unwrap();
            let started = std::time::Instant::now();
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out);
            (started.elapsed(), out)
        });
        // Served meanwhile.
        let other = tokio::task::spawn_blocking(move || {
            ask(
                &path,
                b"get\nprotocol=http\nhost=evil:9\npath=git/o/r.git\n\n",
            )
        });
        assert_eq!(other.await.unwrap(), "");
        let (waited, out) = stuck.await.unwrap();
        assert!(out.is_empty());
        assert!(waited >= Duration::from_millis(150), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
    }

    #[test]
    fn relay_names_a_socket_it_cannot_reach() {
        let err = relay(
            Path::new("/nonexistent/credential.sock"),
            "get",
            &HashMap::new(),
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(err.contains("/nonexistent/credential.sock"), "{err}");
        assert!(err.contains("has the session ended"), "{err}");
    }

    /// Between turns the socket refuses, saying why.
    #[tokio::test]
    async fn between_turns_the_socket_refuses_saying_why() {
        let (b, _) = broker();
        b.open_socket(false);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credential.sock");
        let me = rustix::process::getuid().as_raw();
        let _server = b.serve(&path, vec![me], Duration::from_secs(5)).unwrap();
        let answer = tokio::task::spawn_blocking(move || {
            ask(
                &path,
                b"get\nprotocol=http\nhost=127.0.0.1:9\npath=git/o/r.git\n\n",
            )
        })
        .await
        .unwrap();
        assert!(
            answer.starts_with("quit=1\n") && answer.contains("no turn is running"),
            "{answer}"
        );
    }
}
