//! `hosted-boot credential get|store|erase --context PATH`: the git
//! credential helper (PROTOCOL.md section 3, 2.5), run by git (the agent's
//! git CLI) and by the runner's own transport.
//!
//! git's credential protocol: `key=value` lines on stdin up to a blank line
//! or EOF (`protocol`, `host`, `path`, `username`, …); the answer on stdout.
//!
//! - `get` answers only for the context's remote (protocol, host and path,
//!   which git sends with `credential.useHttpPath`); for anything else it
//!   prints nothing, so git tries its other helpers. Under an exclusive
//!   `flock` of `repo-credential-lock` (so concurrent helpers share one
//!   token instead of minting one each), it answers the token of
//!   `repo-credential-cache` while that is valid for longer than
//!   [`reuse_margin`]; otherwise it pulls a bearer with the boot secret
//!   (2.1), mints a `write` repo token (2.5; git does not say whether it
//!   fetches or pushes, the coordinator scopes the token) and caches it when
//!   it has an `expiresAt` and is not an `artifactsRemote` credential. Every
//!   token it answers, cached or not, is first appended to
//!   `repo-tokens-issued`, which the runner's redactor reads before it
//!   redacts anything more; a token that cannot be recorded there is not
//!   handed out. The answer is `username=x-access-token`,
//!   `password=<token>`. When no token can be had it prints `quit=1` (git
//!   neither asks another helper nor prompts) and the reason on stderr,
//!   without any secret.
//! - `erase` (git's answer to a refused token) empties the cache when it
//!   holds the refused token (or git named none).
//! - `store` does nothing; any other action is ignored, as git asks.
//!
//! The boot secret comes from the `boot-secret` file named by the context,
//! never from the environment (every hosted-boot process removes
//! `ORIZU_BOOT_SECRET` from its environment at start, in `main`).
//!
//! All of the above is file mode. In broker mode (the context's
//! `credentialMode`, the default) the helper relays git's request to the
//! runner's credential broker over its socket ([`super::broker`]) and prints
//! its answer; it reads no secret file, mints nothing, and when the broker
//! cannot be reached prints `quit=1` and the reason on stderr.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::transport::GIT_USER;
use crate::client::{Api, ApiConfig, RepoToken};
use crate::redact::Redactor;
use crate::secret::Secret;
use crate::session_dir::{BootContext, CredentialMode, write_secret_file};
use crate::wire::Access;

/// A cached token is answered only while it is valid for longer than this,
/// or than half its lifetime when that is shorter (see [`reuse_margin`]).
pub const CACHE_MIN_VALIDITY: Duration = Duration::from_secs(5 * 60);

/// How long a helper waits for another helper's lock, in request timeouts
/// (`Timings::request_timeout`; a holder mints with at most 3 attempts of
/// two calls). Past it the helper goes on without the lock: it mints a token
/// of its own, recorded like any other, rather than fail git.
const LOCK_WAIT_REQUEST_TIMEOUTS: u32 = 6;

/// How often a waiting helper tries the lock again.
const LOCK_POLL: Duration = Duration::from_millis(10);

/// Longest line of `repo-tokens-issued` the runner takes for a token; a
/// longer one is not a token this helper wrote.
const MAX_TOKEN_LEN: usize = 16 * 1024;

/// Longest line read from git (git's own attributes are short).
const MAX_INPUT_LINE: usize = 64 * 1024;

/// The cache file's JSON: `{"token": "…", "expiresAtMs": n, "issuedAtMs":
/// n}` (`issuedAtMs`: when the helper minted it, by the local clock).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CacheEntry {
    #[serde(serialize_with = "crate::secret::serialize_exposed")]
    token: Secret,
    expires_at_ms: u64,
    #[serde(default)]
    issued_at_ms: u64,
}

/// A token read back from `repo-credential-cache`.
#[derive(Clone, Debug)]
pub struct CachedToken {
    /// The repo token.
    pub token: Secret,
    /// When it expires (local clock).
    pub expires_at: SystemTime,
    /// When the helper minted it (local clock); `None` for an entry written
    /// without it.
    pub issued_at: Option<SystemTime>,
}

/// How much validity a cached token must have left to be answered: 5
/// minutes ([`CACHE_MIN_VALIDITY`]), or half the token's lifetime when that
/// is shorter, so a coordinator that mints 2-minute tokens still has them
/// shared rather than one minted per git operation (PROTOCOL.md 3).
pub fn reuse_margin(cached: &CachedToken) -> Duration {
    let lifetime = cached
        .issued_at
        .and_then(|issued| cached.expires_at.duration_since(issued).ok());
    match lifetime {
        Some(lifetime) => CACHE_MIN_VALIDITY.min(lifetime / 2),
        None => CACHE_MIN_VALIDITY,
    }
}

/// Runs the helper on the process's stdin, stdout and stderr and returns the
/// exit code (always 0 for `get`/`store`/`erase`: failures are answered with
/// `quit=1`, as git expects). Synchronous: it builds its own current-thread
/// runtime, so call it outside any tokio runtime (from `main`).
pub fn run_credential_helper(action: &str, context_path: &Path) -> i32 {
    let stdin = std::io::stdin();
    credential_helper_with_io(
        action,
        context_path,
        stdin.lock(),
        std::io::stdout().lock(),
        std::io::stderr().lock(),
    )
}

/// [`run_credential_helper`] on given streams (tests, embedding).
pub fn credential_helper_with_io(
    action: &str,
    context_path: &Path,
    input: impl BufRead,
    mut out: impl Write,
    mut err: impl Write,
) -> i32 {
    let attributes = read_attributes(input);
    if let Ok(context) = BootContext::read(context_path)
        && context.credential_mode == CredentialMode::Broker
    {
        relay_to_broker(&context, action, &attributes, &mut out, &mut err);
        let _ = out.flush();
        return 0;
    }
    match action {
        "get" => get(context_path, &attributes, &mut out, &mut err),
        "erase" => erase(context_path, &attributes, &mut err),
        // `store` and any future action: nothing to do (git's rule for
        // helpers is to ignore what they do not know).
        _ => {}
    }
    let _ = out.flush();
    0
}

/// Reads `key=value` lines up to a blank line or EOF. Later values win;
/// `key[]` (multi-valued) keys are kept by their last value, unused here.
pub(crate) fn read_attributes(mut input: impl BufRead) -> HashMap<String, String> {
    let mut attributes = HashMap::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        match input
            .by_ref()
            .take(MAX_INPUT_LINE as u64)
            .read_until(b'\n', &mut line)
        {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches(['\n', '\r']);
        if text.is_empty() {
            break;
        }
        if let Some((key, value)) = text.split_once('=') {
            attributes.insert(key.to_string(), value.to_string());
        }
    }
    attributes
}

fn split_host_port(host: &str) -> (&str, Option<u16>) {
    if host.starts_with('[') {
        if let Some((bracketed, after)) = host
            .find(']')
            .and_then(|end| host.split_at_checked(end + 1))
        {
            let port = after.strip_prefix(':').and_then(|p| p.parse().ok());
            return (bracketed, port);
        }
        return (host, None);
    }
    match host.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
            (h, p.parse().ok())
        }
        _ => (host, None),
    }
}

fn normalize_path(path: &str) -> &str {
    let path = path.trim_matches('/');
    path.strip_suffix(".git").unwrap_or(path)
}

/// Whether git's request (protocol, host, path) is for `remote`. The path
/// is compared without its leading slash and with or without `.git`; a
/// request without a path (no `useHttpPath`) never matches.
pub fn request_matches_remote(attributes: &HashMap<String, String>, remote: &reqwest::Url) -> bool {
    let Some(protocol) = attributes.get("protocol") else {
        return false;
    };
    if !protocol.eq_ignore_ascii_case(remote.scheme()) {
        return false;
    }
    let (Some(host), Some(remote_host)) = (attributes.get("host"), remote.host_str()) else {
        return false;
    };
    let (host, port) = split_host_port(host);
    let default_port = match protocol.to_ascii_lowercase().as_str() {
        "https" => Some(443),
        "http" => Some(80),
        _ => None,
    };
    if !host.eq_ignore_ascii_case(remote_host)
        || port.or(default_port) != remote.port_or_known_default()
    {
        return false;
    }
    match attributes.get("path") {
        Some(path) => normalize_path(path) == normalize_path(remote.path()),
        None => false,
    }
}

/// Reads `repo-credential-cache`: the cached repo token, its expiry and the
/// time it was minted, or `None` when the file is absent, empty (no cached
/// token) or unreadable.
pub fn read_cache_entry(path: &Path) -> Option<CachedToken> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let entry: CacheEntry = serde_json::from_slice(&bytes).ok()?;
    if entry.token.is_empty() {
        return None;
    }
    let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
    Some(CachedToken {
        token: entry.token,
        expires_at: at(entry.expires_at_ms),
        issued_at: (entry.issued_at_ms > 0).then(|| at(entry.issued_at_ms)),
    })
}

fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Caches `token` (minted at `issued_at`) when it has an `expiresAt` and is
/// not an `artifactsRemote` credential; returns whether it did.
fn write_cache(
    path: &Path,
    token: &RepoToken,
    issued_at: SystemTime,
) -> Result<bool, super::WorkspaceError> {
    let Some(expires_at) = token.expires_at else {
        return Ok(false);
    };
    if token.artifacts_remote.is_some() {
        return Ok(false);
    }
    let entry = CacheEntry {
        token: token.token.clone(),
        expires_at_ms: epoch_ms(expires_at),
        issued_at_ms: epoch_ms(issued_at),
    };
    let json =
        serde_json::to_vec(&entry).map_err(|e| crate::session_dir::SessionDirError::Context {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    write_cache_file(path, &json)?;
    Ok(true)
}

/// Writes the cache file, atomically when the helper may create a file in
/// its directory; otherwise (a helper run as the agent user, whose session
/// directory is the runner's: PROTOCOL.md 3, "The agent as another user")
/// in place, under the helpers' lock: a reader that went on without the
/// lock and reads a torn entry sees no cached token and mints its own.
fn write_cache_file(path: &Path, contents: &[u8]) -> Result<(), super::WorkspaceError> {
    use crate::session_dir::SessionDirError;
    match write_secret_file(path, contents) {
        Err(SessionDirError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            let in_place = || -> std::io::Result<()> {
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(path)?;
                let mut bytes = contents.to_vec();
                if !bytes.ends_with(b"\n") {
                    bytes.push(b'\n');
                }
                file.write_all(&bytes)?;
                file.sync_all()
            };
            in_place().map_err(|e| SessionDirError::io("write in place", path, e).into())
        }
        other => other.map_err(Into::into),
    }
}

/// Appends `token` to `repo-tokens-issued` (one line, one `write` on an
/// `O_APPEND` descriptor, so concurrent appenders never interleave), which
/// the runner's redactor reads (PROTOCOL.md 3). Created 0600 if missing.
///
/// Errors: the file cannot be opened or written (the token must then not
/// be handed out).
pub fn record_issued_token(path: &Path, token: &Secret) -> std::io::Result<()> {
    let mut line = Vec::with_capacity(token.expose().len() + 1);
    line.extend_from_slice(token.expose().as_bytes());
    line.push(b'\n');
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    file.write_all(&line)
}

/// Reads the tokens appended to `repo-tokens-issued` since the last call:
/// the runner's side of [`record_issued_token`]. Cheap when nothing
/// changed (one `stat`), so it can run before every redaction.
pub struct IssuedTokens {
    path: PathBuf,
    /// Inode and bytes consumed (up to the last complete line).
    seen: Option<(u64, u64)>,
}

impl IssuedTokens {
    /// A reader of `path` that has read nothing yet.
    pub fn new(path: PathBuf) -> IssuedTokens {
        IssuedTokens { path, seen: None }
    }

    /// The tokens of the lines completed since the last call. A file that
    /// was replaced or truncated (a new inode, or shorter than what was
    /// read) is read again from its start. With `--agent-user` in file mode
    /// the file is the agent's (issue 31): only a regular file is read, at
    /// most [`MAX_ISSUED_READ`] bytes a call, opened without following a
    /// link or blocking, and only a line shaped like a token becomes a
    /// secret ([`token_shaped`]): `0`…`f` or `session` as secrets made
    /// every log line and the harvest's report unreadable.
    pub fn poll(&mut self) -> Vec<Secret> {
        let Ok(meta) = std::fs::symlink_metadata(&self.path) else {
            return Vec::new();
        };
        if !meta.is_file() {
            return Vec::new();
        }
        let (ino, len) = (meta.ino(), meta.len());
        let offset = match self.seen {
            Some((i, o)) if i == ino && o <= len => o,
            _ => 0,
        };
        if self.seen == Some((ino, len)) {
            return Vec::new();
        }
        let Ok(mut file) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&self.path)
        else {
            return Vec::new();
        };
        let mut bytes = Vec::new();
        if file.seek(SeekFrom::Start(offset)).is_err()
            || (&mut file)
                .take(MAX_ISSUED_READ)
                .read_to_end(&mut bytes)
                .is_err()
        {
            return Vec::new();
        }
        // Only complete lines: an appender's single write may still be
        // landing; the rest is read at the next poll.
        let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1);
        // A read with no line end and longer than any token is no token:
        // passed over, not read again at every poll.
        let consumed = if complete == 0 && bytes.len() > MAX_TOKEN_LEN {
            bytes.len()
        } else {
            complete
        };
        self.seen = Some((ino, offset + consumed as u64));
        bytes[..complete]
            .split(|&b| b == b'\n')
            .filter_map(|l| std::str::from_utf8(l).ok())
            .filter(|t| token_shaped(t))
            .map(|t| Secret::new(t.to_string()))
            .collect()
    }
}

/// Most bytes [`IssuedTokens::poll`] reads in one call (the rest at the
/// next): a file grown to gigabytes cannot fill the runner's memory.
pub const MAX_ISSUED_READ: u64 = 1 << 20;

/// Shortest line of `repo-tokens-issued` taken as a token: no repo token is
/// this short, and a shorter secret would redact common words.
pub const MIN_TOKEN_LEN: usize = 16;

/// Whether `line` may be a repo token: [`MIN_TOKEN_LEN`] to
/// [`MAX_TOKEN_LEN`] printable ASCII characters, no blank.
pub fn token_shaped(line: &str) -> bool {
    (MIN_TOKEN_LEN..=MAX_TOKEN_LEN).contains(&line.len())
        && line.bytes().all(|b| b.is_ascii_graphic())
}

/// An exclusive `flock` of `repo-credential-lock`, released when dropped
/// (or when the process dies, which a lock file's content could not be).
struct HelperLock {
    _file: File,
}

/// Takes the helpers' lock, waiting at most `wait`; `Err` says why the
/// helper goes on without it.
fn lock(path: &Path, wait: Duration) -> Result<HelperLock, String> {
    use rustix::fs::{FlockOperation, flock};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("cannot open the lock file {}: {e}", path.display()))?;
    let deadline = Instant::now() + wait;
    loop {
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(HelperLock { _file: file }),
            Err(rustix::io::Errno::WOULDBLOCK) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(format!("cannot lock {}: {e}", path.display())),
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "another credential helper held {} for {} s",
                path.display(),
                wait.as_secs()
            ));
        }
        std::thread::sleep(LOCK_POLL);
    }
}

fn answer(out: &mut impl Write, token: &Secret) {
    let _ = write!(out, "username={GIT_USER}\npassword={}\n", token.expose());
}

fn quit(out: &mut impl Write, err: &mut impl Write, reason: &str) {
    let _ = writeln!(out, "quit=1");
    let _ = writeln!(err, "hosted-boot credential: {reason}");
}

/// Broker mode: git's request to the broker, its answer to git.
fn relay_to_broker(
    context: &BootContext,
    action: &str,
    attributes: &HashMap<String, String>,
    out: &mut impl Write,
    err: &mut impl Write,
) {
    if !matches!(action, "get" | "erase") {
        return;
    }
    let Some(socket) = &context.credential_socket else {
        if action == "get" {
            quit(
                out,
                err,
                "the boot context names no credential broker socket",
            );
        }
        return;
    };
    // The broker mints with at most 3 attempts of two calls: as long as the
    // file helper waits for another helper's lock.
    let wait = context
        .timings()
        .request_timeout
        .saturating_mul(LOCK_WAIT_REQUEST_TIMEOUTS);
    match super::broker::relay(socket, action, attributes, wait) {
        Ok((answer, reason)) => {
            if action == "get" {
                let _ = out.write_all(answer.expose().as_bytes());
            }
            if let Some(reason) = reason {
                let _ = writeln!(err, "hosted-boot credential: {reason}");
            }
        }
        Err(reason) if action == "get" => quit(out, err, &reason),
        Err(reason) => {
            let _ = writeln!(err, "hosted-boot credential: {reason}");
        }
    }
}

fn get(
    context_path: &Path,
    attributes: &HashMap<String, String>,
    out: &mut impl Write,
    err: &mut impl Write,
) {
    let context = match BootContext::read(context_path) {
        Ok(c) => c,
        Err(e) => {
            return quit(
                out,
                err,
                &format!("cannot read the boot context ({e}); has the session ended?"),
            );
        }
    };
    let remote = match crate::validate::url("clone URL", &context.remote_url, context.insecure_http)
    {
        Ok(u) => u,
        Err(e) => return quit(out, err, &format!("the boot context is invalid: {e}")),
    };
    let submodule = context.submodule_remotes.iter().any(|u| {
        crate::validate::url("submodule URL", u, context.insecure_http)
            .is_ok_and(|u| request_matches_remote(attributes, &u))
    });
    if !submodule && !request_matches_remote(attributes, &remote) {
        // Not our remote: let git ask its other helpers.
        return;
    }
    let wait = context
        .timings()
        .request_timeout
        .saturating_mul(LOCK_WAIT_REQUEST_TIMEOUTS);
    let _lock = match lock(&context.credential_lock_path, wait) {
        Ok(l) => Some(l),
        Err(reason) => {
            let _ = writeln!(
                err,
                "hosted-boot credential: {reason}; minting a token without it"
            );
            None
        }
    };
    let token = match cached_or_minted(&context, err) {
        Ok(t) => t,
        Err(reason) => return quit(out, err, &reason),
    };
    answer(out, &token);
}

/// The cached token while it is valid for long enough, else a new one
/// (cached when it can be). Either way recorded in `repo-tokens-issued`
/// before it is returned. Runs under the helpers' lock.
fn cached_or_minted(context: &BootContext, err: &mut impl Write) -> Result<Secret, String> {
    let cached = read_cache_entry(&context.credential_cache_path)
        .filter(|c| c.expires_at > SystemTime::now() + reuse_margin(c));
    let (token, minted) = match cached {
        Some(c) => (c.token, None),
        None => {
            let issued_at = SystemTime::now();
            let token = mint(context)?;
            (token.token.clone(), Some((token, issued_at)))
        }
    };
    if token
        .expose()
        .bytes()
        .any(|b| b == b'\n' || b == b'\r' || b == 0)
    {
        // git's protocol and the issued list are line-based.
        return Err("the repo token holds a line break or NUL; refusing it".to_string());
    }
    // Recorded before the cache is written, so that the cache never holds a
    // token the runner's redactor cannot learn, and before it is printed.
    record_issued_token(&context.issued_tokens_path, &token).map_err(|e| {
        format!(
            "cannot record the repo token for redaction in {} ({e}); not handing it out",
            context.issued_tokens_path.display()
        )
    })?;
    if let Some((repo_token, issued_at)) = minted
        && let Err(e) = write_cache(&context.credential_cache_path, &repo_token, issued_at)
    {
        // Not fatal: the token is still good, only not cached.
        let _ = writeln!(
            err,
            "hosted-boot credential: cannot cache the repo token: {e}"
        );
    }
    Ok(token)
}

/// Pulls a bearer with the boot secret and mints a `write` repo token, each
/// with the credential helper's retry policy (3 attempts, PROTOCOL.md 2).
/// The error text is redacted (boot secret, bearer).
fn mint(context: &BootContext) -> Result<RepoToken, String> {
    let Some(boot_secret_path) = &context.boot_secret_path else {
        return Err("the boot context names no boot secret file".to_string());
    };
    let boot_secret = std::fs::read_to_string(boot_secret_path).map_err(|e| {
        format!(
            "cannot read the boot secret file {}: {e}",
            boot_secret_path.display()
        )
    })?;
    let boot_secret = Secret::new(boot_secret.trim_end_matches(['\n', '\r']).to_string());
    if boot_secret.expose().is_empty() {
        return Err(format!(
            "the boot secret file {} is empty",
            boot_secret_path.display()
        ));
    }
    let mut api_base = context.api_base_url.clone();
    if !api_base.ends_with('/') {
        api_base.push('/');
    }
    let api_base = crate::validate::url("ORIZU_API_BASE_URL", &api_base, context.insecure_http)
        .map_err(|e| format!("the boot context is invalid: {e}"))?;
    let agent_token_url = crate::validate::url(
        "ORIZU_AGENT_TOKEN_URL",
        &context.agent_token_url,
        context.insecure_http,
    )
    .map_err(|e| format!("the boot context is invalid: {e}"))?;
    let http = crate::tls::http_client(context.ca_file.as_deref()).map_err(|e| format!("{e:#}"))?;
    let timings = context.timings();
    let redactor = Redactor::new();
    let api = Api::new(
        ApiConfig {
            api_base,
            // The helper never posts a status; the field is unused here.
            boot_status_url: agent_token_url.clone(),
            agent_token_url,
            session_id: context.session_id.clone(),
            boot_secret,
        },
        http,
        timings,
        redactor.clone(),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let policy = crate::client::Policy::CREDENTIAL_HELPER;
    runtime
        .block_on(async {
            api.pull_bearer(policy).await?;
            api.repo_token(Access::Write, policy).await
        })
        .map_err(|e| redactor.redact(&format!("cannot mint a repo token: {e}")))
}

fn erase(context_path: &Path, attributes: &HashMap<String, String>, err: &mut impl Write) {
    let Ok(context) = BootContext::read(context_path) else {
        return;
    };
    let Ok(remote) = reqwest::Url::parse(&context.remote_url) else {
        return;
    };
    if !request_matches_remote(attributes, &remote) {
        return;
    }
    let wait = context
        .timings()
        .request_timeout
        .saturating_mul(LOCK_WAIT_REQUEST_TIMEOUTS);
    let _lock = lock(&context.credential_lock_path, wait).ok();
    // A concurrent helper may have replaced the refused token with a good
    // one already: drop only the token git refused.
    if let (Some(refused), Some(cached)) = (
        attributes.get("password"),
        read_cache_entry(&context.credential_cache_path),
    ) && refused != cached.token.expose()
    {
        return;
    }
    if let Err(e) = write_cache_file(&context.credential_cache_path, b"") {
        let _ = writeln!(
            err,
            "hosted-boot credential: cannot clear the token cache: {e}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(text: &str) -> HashMap<String, String> {
        read_attributes(text.as_bytes())
    }

    #[test]
    fn attributes_stop_at_blank_line() {
        let a = attrs(
            "protocol=https\nhost=github.com\r\nwwwauth[]=Basic realm=x\n\nusername=ignored\n",
        );
        assert_eq!(a.get("protocol").map(String::as_str), Some("https"));
        assert_eq!(a.get("host").map(String::as_str), Some("github.com"));
        assert_eq!(
            a.get("wwwauth[]").map(String::as_str),
            Some("Basic realm=x")
        );
        assert!(!a.contains_key("username"));
    }

    #[test]
    fn path_matching_follows_git() {
        let remote = reqwest::Url::parse("https://github.com/o/r.git").unwrap();
        for ok in [
            "protocol=https\nhost=github.com\npath=o/r.git\n",
            "protocol=https\nhost=github.com\npath=o/r\n",
            "protocol=https\nhost=GitHub.com:443\npath=/o/r.git\n",
        ] {
            assert!(request_matches_remote(&attrs(ok), &remote), "{ok}");
        }
        for bad in [
            "protocol=https\nhost=github.com\n",
            "protocol=http\nhost=github.com\npath=o/r.git\n",
            "protocol=https\nhost=github.com:444\npath=o/r.git\n",
            "protocol=https\nhost=evil.com\npath=o/r.git\n",
            "protocol=https\nhost=github.com\npath=o/other.git\n",
            "protocol=https\nhost=github.com\npath=o/r.git/x\n",
            "host=github.com\npath=o/r.git\n",
        ] {
            assert!(!request_matches_remote(&attrs(bad), &remote), "{bad}");
        }
        let local = reqwest::Url::parse("http://127.0.0.1:8080/git/o/r.git").unwrap();
        assert!(request_matches_remote(
            &attrs("protocol=http\nhost=127.0.0.1:8080\npath=git/o/r.git\n"),
            &local
        ));
        assert!(!request_matches_remote(
            &attrs("protocol=http\nhost=127.0.0.1\npath=git/o/r.git\n"),
            &local
        ));
        let v6 = reqwest::Url::parse("http://[::1]:9/r.git").unwrap();
        assert!(request_matches_remote(
            &attrs("protocol=http\nhost=[::1]:9\npath=r.git\n"),
            &v6
        ));
    }

    #[test]
    fn cache_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache");
        assert!(read_cache_entry(&path).is_none());
        std::fs::write(&path, "\n").unwrap();
        assert!(read_cache_entry(&path).is_none());
        let expires = UNIX_EPOCH + Duration::from_millis(4_000_000_000_000);
        let token = RepoToken {
            token: Secret::new("tok".into()),
            expires_at: Some(expires),
            repo_full_name: Some("o/r".into()),
            artifacts_remote: None,
        };
        let issued = expires - Duration::from_secs(120);
        assert!(write_cache(&path, &token, issued).unwrap());
        let cached = read_cache_entry(&path).unwrap();
        assert_eq!(cached.token.expose(), "tok");
        assert_eq!(cached.expires_at, expires);
        let entry = read_cache_entry(&path).unwrap();
        assert_eq!(entry.issued_at, Some(issued));
        // A 2-minute token is shared while it has a minute left.
        assert_eq!(reuse_margin(&entry), Duration::from_secs(60));
        let uncached = RepoToken {
            expires_at: None,
            ..token.clone()
        };
        assert!(!write_cache(&path, &uncached, issued).unwrap());
        let artifacts = RepoToken {
            artifacts_remote: Some("https://x/git/a/b.git".into()),
            ..token
        };
        assert!(!write_cache(&path, &artifacts, issued).unwrap());
    }

    #[test]
    fn reuse_margin_is_five_minutes_or_half_the_lifetime() {
        let now = SystemTime::now();
        let entry = |issued: Option<Duration>, ttl: Duration| CachedToken {
            token: Secret::new("t".into()),
            expires_at: now + ttl,
            issued_at: issued.map(|_| now),
        };
        let hour = Duration::from_secs(3600);
        assert_eq!(reuse_margin(&entry(Some(hour), hour)), CACHE_MIN_VALIDITY);
        assert_eq!(reuse_margin(&entry(None, hour)), CACHE_MIN_VALIDITY);
        assert_eq!(
            reuse_margin(&entry(Some(hour), Duration::from_secs(60))),
            Duration::from_secs(30)
        );
    }

    #[test]
    fn issued_tokens_are_read_once_each_by_complete_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("issued");
        let mut reader = IssuedTokens::new(path.clone());
        assert!(reader.poll().is_empty(), "absent file");
        write_secret_file(&path, b"").unwrap();
        assert!(reader.poll().is_empty(), "created empty");
        record_issued_token(&path, &Secret::new("repo-token-one-0001".into())).unwrap();
        record_issued_token(&path, &Secret::new("repo-token-two-0002".into())).unwrap();
        let got: Vec<String> = reader.poll().iter().map(|s| s.expose().into()).collect();
        assert_eq!(got, ["repo-token-one-0001", "repo-token-two-0002"]);
        assert!(reader.poll().is_empty(), "nothing new");
        // A line still being written waits for its newline.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"repo-token-th")
            .unwrap();
        assert!(reader.poll().is_empty());
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"ree-0003\n")
            .unwrap();
        let got: Vec<String> = reader.poll().iter().map(|s| s.expose().into()).collect();
        assert_eq!(got, ["repo-token-three-0003"]);
        // Replaced (a new inode): read from the start again.
        write_secret_file(&path, b"repo-token-four-0004").unwrap();
        let got: Vec<String> = reader.poll().iter().map(|s| s.expose().into()).collect();
        assert_eq!(got, ["repo-token-four-0004"]);
        let mode = std::fs::metadata(&path).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // The agent's lines that are no token (issue 31): short words, a
        // blank, a control character; a file over the read cap is read a
        // cap at a time.
        write_secret_file(
            &path,
            b"0\nsession\nrepo token with blanks\nrepo-token-\x07bell-0005\nrepo-token-five-0005",
        )
        .unwrap();
        let got: Vec<String> = reader.poll().iter().map(|s| s.expose().into()).collect();
        assert_eq!(got, ["repo-token-five-0005"]);
        let big = std::fs::File::create(dir.path().join("big")).unwrap();
        big.set_len(MAX_ISSUED_READ * 3).unwrap();
        std::fs::rename(dir.path().join("big"), &path).unwrap();
        for _ in 0..3 {
            assert!(reader.poll().is_empty());
        }
        assert_eq!(reader.seen.map(|(_, o)| o), Some(MAX_ISSUED_READ * 3));
        // Not a regular file: not read (a FIFO would block).
        std::fs::remove_file(&path).unwrap();
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &path,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .unwrap();
        assert!(reader.poll().is_empty());
    }

    #[test]
    fn the_lock_is_exclusive_and_its_wait_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let held = lock(&path, Duration::ZERO).unwrap();
        let started = Instant::now();
        let err = lock(&path, Duration::from_millis(50)).err().unwrap();
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert!(err.contains("another credential helper"), "{err}");
        drop(held);
        lock(&path, Duration::ZERO).unwrap();
    }

    #[test]
    fn missing_context_quits_without_secret() {
        let mut out = Vec::new();
        let mut err = Vec::new();
        let code = credential_helper_with_io(
            "get",
            Path::new("/nonexistent/boot-context.json"),
            "protocol=https\nhost=x\n\n".as_bytes(),
            &mut out,
            &mut err,
        );
        assert_eq!(code, 0);
        assert_eq!(String::from_utf8(out).unwrap(), "quit=1\n");
        assert!(String::from_utf8(err).unwrap().contains("boot context"));
    }

    #[test]
    fn broker_mode_without_a_broker_quits_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let context_path = dir.path().join("boot-context.json");
        let socket = dir.path().join("credential.sock");
        BootContext {
            api_base_url: "http://127.0.0.1:9/".into(),
            agent_token_url: "http://127.0.0.1:9/t".into(),
            session_id: "s1".into(),
            remote_url: "http://127.0.0.1:9/git/o/r.git".into(),
            submodule_remotes: Vec::new(),
            credential_mode: CredentialMode::Broker,
            credential_socket: Some(socket.clone()),
            boot_secret_path: None,
            credential_cache_path: dir.path().join("cache"),
            issued_tokens_path: dir.path().join("issued"),
            credential_lock_path: dir.path().join("lock"),
            ca_file: None,
            insecure_http: false,
            time_scale: 0.01,
        }
        .write(&context_path)
        .unwrap();
        let mut out = Vec::new();
        let mut err = Vec::new();
        let request = "protocol=http\nhost=127.0.0.1:9\npath=git/o/r.git\n\n";
        credential_helper_with_io("get", &context_path, request.as_bytes(), &mut out, &mut err);
        assert_eq!(String::from_utf8(out).unwrap(), "quit=1\n");
        let err = String::from_utf8(err).unwrap();
        assert!(err.contains("cannot reach the credential broker"), "{err}");
        assert!(err.contains(&socket.display().to_string()), "{err}");
        // No file-mode fallback: nothing was created beside the context.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn store_and_unknown_actions_do_nothing() {
        for action in ["store", "frobnicate"] {
            let mut out = Vec::new();
            let code = credential_helper_with_io(
                action,
                Path::new("/nonexistent"),
                "".as_bytes(),
                &mut out,
                Vec::new(),
            );
            assert_eq!(code, 0);
            assert!(out.is_empty());
        }
    }
}
