//! The harvester's git work against the session remote: the fetch of the
//! session branch, the never-forced push of a ref, and the loop that runs
//! them through the boot's transport and credential helper, retrying
//! transport failures within the harvest's time bound (PROTOCOL.md section
//! 2 table, the harvest row).

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Instant;

use git2::{
    AutotagOption, Direction, ErrorClass, ErrorCode, FetchOptions, Oid, PushOptions,
    RemoteCallbacks, Repository,
};

use super::harvest::{Harvester, message};
use super::transport::{CredentialHelpers, HttpContext, register_remote};
use crate::client::retry::wait_before_retry;

/// Most bytes of the server's side-band text kept for a refusal's report.
const MAX_REMOTE_TEXT: usize = 2048;

/// Why an attempt to reach the remote failed.
#[derive(Debug)]
pub(super) enum Failure {
    /// A transport failure: retried.
    Transport(String),
    /// A ref update refused (non-fast-forward, hook): a verdict for that
    /// ref; the work may still go to a recovery branch.
    RefRejected(String),
    /// Refused by the server (credentials, no such repository): a verdict.
    Verdict(String),
    /// Local git work failed (`repo/` could not be read or written).
    Local(String),
}

/// Why [`Harvester::with_remote`] gave up.
#[derive(Debug)]
pub(super) enum RemoteError {
    /// The bound ran out before the first attempt.
    NoTime,
    /// The transport could not be registered.
    Setup(String),
    /// Refused by git or the server: a verdict, not retried.
    Refused(String),
    /// Local git work failed: not retried.
    Local(String),
    /// A transport failure on every attempt.
    Exhausted { attempts: u32, last: String },
    /// The bound ran out between attempts.
    OutOfTime { attempts: u32, last: String },
}

impl RemoteError {
    /// The error as a sentence about `what` (e.g. "the fetch of … from …").
    pub(super) fn describe(&self, what: &str) -> String {
        match self {
            RemoteError::NoTime => format!("{what}: the time bound ran out before it started"),
            RemoteError::Setup(text) => format!("{what} could not start: {text}"),
            RemoteError::Refused(text) => format!("{what} was refused: {text}"),
            RemoteError::Local(text) => format!("{what} failed in repo/: {text}"),
            RemoteError::Exhausted { attempts, last } => {
                format!("{what} failed after {attempts} attempts: {last}")
            }
            RemoteError::OutOfTime { attempts, last } => format!(
                "{what}: the time bound ran out after {attempts} attempts; the last failed: {last}"
            ),
        }
    }
}

fn classify(e: git2::Error) -> Failure {
    match (e.code(), e.class()) {
        (ErrorCode::Auth, _)
        | (ErrorCode::Certificate, _)
        | (ErrorCode::NotFound, ErrorClass::Http) => Failure::Verdict(message(&e)),
        (ErrorCode::NotFastForward, _) => Failure::RefRejected(message(&e)),
        _ => Failure::Transport(message(&e)),
    }
}

impl Harvester {
    /// Runs `op` (git work on the remote) with the boot's transport and
    /// credential helper registered for the remote URL, retrying transport
    /// failures as the section 2 table says for the harvest (3 attempts, 1 s,
    /// cap 4 s) within `deadline`; each request's timeout is cut to what is
    /// left of it. `what` names the work in the log.
    pub(super) fn with_remote<T>(
        &self,
        deadline: Instant,
        what: &str,
        mut op: impl FnMut() -> Result<T, Failure>,
    ) -> Result<T, RemoteError> {
        let helpers = CredentialHelpers::new(["", self.credential_helper.as_str()], true);
        let policy = self.push_policy;
        let mut failures = 0u32;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(RemoteError::NoTime);
            }
            let http = HttpContext {
                request_timeout: self.http.request_timeout.min(remaining),
                ..self.http.clone()
            };
            let _registration = register_remote(&self.remote_url, http, helpers.clone())
                .map_err(|e| RemoteError::Setup(message(&e)))?;
            match op() {
                Ok(value) => return Ok(value),
                Err(Failure::Verdict(text) | Failure::RefRejected(text)) => {
                    return Err(RemoteError::Refused(text));
                }
                Err(Failure::Local(text)) => return Err(RemoteError::Local(text)),
                Err(Failure::Transport(text)) => {
                    failures += 1;
                    if failures >= policy.attempts {
                        return Err(RemoteError::Exhausted {
                            attempts: failures,
                            last: text,
                        });
                    }
                    let wait = wait_before_retry(policy, failures - 1, None);
                    if Instant::now() + wait >= deadline {
                        return Err(RemoteError::OutOfTime {
                            attempts: failures,
                            last: text,
                        });
                    }
                    tracing::warn!(what, attempt = failures, error = %text, "git request failed; retrying");
                    std::thread::sleep(wait);
                }
            }
        }
    }
}

/// The remote as the harvest's fetch found it.
pub(super) struct RemoteState {
    /// The session branch's tip (downloaded), `None` when it is missing.
    pub(super) session_tip: Option<Oid>,
    /// Every branch on the remote (`refs/heads/…` → tip).
    pub(super) heads: HashMap<String, Oid>,
}

/// Lists the remote's refs and downloads the session branch when its tip is
/// not here yet; updates `refs/remotes/origin/<branch>`.
pub(super) fn fetch(repo: &Repository, url: &str, branch: &str) -> Result<RemoteState, Failure> {
    let mut remote = repo.remote_anonymous(url).map_err(classify)?;
    let mut connection = remote
        .connect_auth(Direction::Fetch, None, None)
        .map_err(classify)?;
    let heads: HashMap<String, Oid> = connection
        .list()
        .map_err(classify)?
        .iter()
        .filter(|h| h.name().starts_with("refs/heads/"))
        .map(|h| (h.name().to_string(), h.oid()))
        .collect();
    let session_tip = heads.get(&format!("refs/heads/{branch}")).copied();
    if let Some(tip) = session_tip {
        let present = repo.odb().is_ok_and(|odb| odb.exists(tip));
        if !present {
            let mut options = FetchOptions::new();
            options.download_tags(AutotagOption::None);
            connection
                .remote()
                .download(
                    &[format!("+refs/heads/{branch}:refs/remotes/origin/{branch}")],
                    Some(&mut options),
                )
                .map_err(classify)?;
        }
    }
    connection.remote().disconnect().map_err(classify)?;
    if let Some(tip) = session_tip {
        repo.reference(
            &format!("refs/remotes/origin/{branch}"),
            tip,
            true,
            "hosted-boot: harvest: fetch the session branch",
        )
        .map_err(|e| Failure::Transport(message(&e)))?;
    }
    Ok(RemoteState { session_tip, heads })
}

/// Pushes `HEAD` to `target` (a full ref name), never forced.
pub(super) fn push(repo: &Repository, url: &str, target: &str) -> Result<(), Failure> {
    push_ref(repo, url, "HEAD", target)
}

/// Pushes the local ref `source` (`HEAD`, a full ref name) to `target` (a
/// full ref name), never forced.
pub(super) fn push_ref(
    repo: &Repository,
    url: &str,
    source: &str,
    target: &str,
) -> Result<(), Failure> {
    let mut remote = repo.remote_anonymous(url).map_err(classify)?;
    let refused: RefCell<Vec<String>> = RefCell::new(Vec::new());
    // What the server says on the side band ("remote: …"): a hook's reason
    // for refusing (a file over the host's size limit, say), which the ref
    // status alone ("pre-receive hook declined") does not give.
    let said: RefCell<String> = RefCell::new(String::new());
    {
        let mut callbacks = RemoteCallbacks::new();
        callbacks.push_update_reference(|name, status| {
            if let Some(s) = status {
                refused.borrow_mut().push(format!("{name}: {s}"));
            }
            Ok(())
        });
        callbacks.sideband_progress(|data| {
            let mut said = said.borrow_mut();
            if said.len() < MAX_REMOTE_TEXT {
                said.push_str(&String::from_utf8_lossy(data));
            }
            true
        });
        let mut options = PushOptions::new();
        options.remote_callbacks(callbacks);
        remote
            .push(&[format!("{source}:{target}")], Some(&mut options))
            .map_err(classify)?;
    }
    let refused = refused.into_inner();
    if !refused.is_empty() {
        let said: String = said
            .into_inner()
            .split(['\n', '\r'])
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        let mut text = refused.join("; ");
        if !said.is_empty() {
            text = format!("{text} (the server said: {said})");
        }
        return Err(Failure::RefRejected(text));
    }
    tracing::info!(source, target, "harvest: pushed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use git2::{ErrorClass, ErrorCode};

    use super::*;

    #[test]
    fn errors_are_classified_as_the_retry_rule_says() {
        let e = |code, class| git2::Error::new(code, class, "x");
        assert!(matches!(
            classify(e(ErrorCode::Auth, ErrorClass::Http)),
            Failure::Verdict(_)
        ));
        assert!(matches!(
            classify(e(ErrorCode::NotFound, ErrorClass::Http)),
            Failure::Verdict(_)
        ));
        assert!(matches!(
            classify(e(ErrorCode::NotFastForward, ErrorClass::Reference)),
            Failure::RefRejected(_)
        ));
        assert!(matches!(
            classify(e(ErrorCode::GenericError, ErrorClass::Http)),
            Failure::Transport(_)
        ));
        assert!(matches!(
            classify(e(ErrorCode::GenericError, ErrorClass::Net)),
            Failure::Transport(_)
        ));
    }
}
