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
use super::secret_guard::{PushGate, Refusal};
use super::transport::{CredentialHelpers, HttpContext, register_remote};
use crate::client::retry::{self, Attempt, GaveUp, Pace, Policy};

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
    /// The push gate refused it (a secret in what it would bring, or a
    /// target outside the push policy): a verdict, never retried.
    Blocked(String),
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
    /// credential helper registered for the remote URL, its transport
    /// failures retried by the engine under `policy` (the section 2 table's
    /// row of the caller: [`Policy::HARVEST_PUSH`] or
    /// [`Policy::WORKSPACE_SYNC`], 3 attempts, 1 s, cap 4 s, scaled by
    /// [`Harvester::time_scale`]) within `deadline`; each request's timeout is
    /// cut to what is left of it. `what` names the work in the log.
    pub(super) fn with_remote<T>(
        &self,
        deadline: Instant,
        what: &str,
        policy: Policy,
        op: impl FnMut() -> Result<T, Failure>,
    ) -> Result<T, RemoteError> {
        self.with_remote_paced(deadline, what, policy, &retry::REAL, op)
    }

    /// [`Harvester::with_remote`], waiting through `pace` (tests record the
    /// waits instead of sleeping).
    fn with_remote_paced<T>(
        &self,
        deadline: Instant,
        what: &str,
        policy: Policy,
        pace: &dyn Pace,
        mut op: impl FnMut() -> Result<T, Failure>,
    ) -> Result<T, RemoteError> {
        let helpers = CredentialHelpers::new(["", self.credential_helper.as_str()], true);
        let policy = policy.scaled(self.time_scale);
        let result = retry::run_blocking(what, policy, pace, Some(deadline), || {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Attempt::Done(Err(RemoteError::NoTime));
            }
            let http = HttpContext {
                request_timeout: self.http.request_timeout.min(remaining),
                ..self.http.clone()
            };
            let _registration = match register_remote(&self.remote_url, http, helpers.clone()) {
                Ok(registration) => registration,
                Err(e) => return Attempt::Done(Err(RemoteError::Setup(message(&e)))),
            };
            match op() {
                Ok(value) => Attempt::Done(Ok(value)),
                Err(
                    Failure::Verdict(text) | Failure::RefRejected(text) | Failure::Blocked(text),
                ) => Attempt::Done(Err(RemoteError::Refused(text))),
                Err(Failure::Local(text)) => Attempt::Done(Err(RemoteError::Local(text))),
                Err(Failure::Transport(text)) => Attempt::Retry {
                    error: text,
                    retry_after: None,
                },
            }
        });
        match result {
            Ok(done) => done,
            Err(GaveUp::Exhausted { attempts, last }) => {
                Err(RemoteError::Exhausted { attempts, last })
            }
            Err(GaveUp::OutOfTime { attempts, last }) => {
                Err(RemoteError::OutOfTime { attempts, last })
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
    traced("git fetch", branch, || fetch_in(repo, url, branch))
}

/// `work`, one fetch or push, in a span of its own (issue 40): its ref,
/// and its failure.
fn traced<T>(
    name: &'static str,
    git_ref: &str,
    work: impl FnOnce() -> Result<T, Failure>,
) -> Result<T, Failure> {
    let span = tracing::info_span!(
        "git",
        otel.name = name,
        git_ref,
        otel.status_code = tracing::field::Empty,
        error = tracing::field::Empty,
    );
    let done = span.in_scope(work);
    if let Err(failure) = &done {
        span.record("otel.status_code", "ERROR");
        span.record("error", tracing::field::debug(failure));
    }
    done
}

fn fetch_in(repo: &Repository, url: &str, branch: &str) -> Result<RemoteState, Failure> {
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

/// Pushes `HEAD` to `target` (a full ref name), never forced, through
/// `gate` ([`push_ref`]).
pub(super) fn push(
    repo: &Repository,
    url: &str,
    target: &str,
    gate: &PushGate<'_>,
    heads: &HashMap<String, Oid>,
) -> Result<(), Failure> {
    push_ref(repo, url, "HEAD", target, gate, heads)
}

/// Pushes the local ref `source` (`HEAD`, a full ref name) to `target` (a
/// full ref name), never forced. The one function of the runner that
/// pushes: `gate` checks the push first (the push policy, and no secret in
/// the commits from `source` back to the remote's branches `heads`,
/// PROTOCOL.md 4.5); what it refuses is [`Failure::Blocked`].
pub(super) fn push_ref(
    repo: &Repository,
    url: &str,
    source: &str,
    target: &str,
    gate: &PushGate<'_>,
    heads: &HashMap<String, Oid>,
) -> Result<(), Failure> {
    traced("git push", target, || {
        push_ref_in(repo, url, source, target, gate, heads)
    })
}

fn push_ref_in(
    repo: &Repository,
    url: &str,
    source: &str,
    target: &str,
    gate: &PushGate<'_>,
    heads: &HashMap<String, Oid>,
) -> Result<(), Failure> {
    let commit = repo
        .revparse_single(source)
        .and_then(|o| o.peel_to_commit())
        .map_err(|e| Failure::Local(message(&e)))?;
    match gate.check(repo, commit.id(), target, heads) {
        Ok(()) => {}
        Err(Refusal::Policy(text)) => return Err(Failure::Blocked(text)),
        Err(Refusal::Secret(what)) => {
            tracing::error!(target, what = %what, "push refused: what it would bring holds a secret");
            return Err(Failure::Blocked(format!(
                "the push to {target} was held back: it would bring a secret ({what})"
            )));
        }
        Err(Refusal::Unreadable(text)) => return Err(Failure::Local(text)),
    }
    // Pushed by id: what was checked is what goes.
    let source = commit.id().to_string();
    let source = source.as_str();
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
        if let Err(e) = remote.push(&[format!("{source}:{target}")], Some(&mut options)) {
            // The server refused what it received (`receive.fsckObjects` on
            // a malformed object of the agent's, a quarantine hook): a
            // verdict on the objects, the same on every attempt and for
            // any ref (no recovery branch would take them). libgit2 gives
            // it no code of its own (src/libgit2/push.c), only this message.
            if e.message().contains(UNPACK_FAILED) {
                return Err(Failure::Verdict(with_server_text(message(&e), said.take())));
            }
            return Err(classify(e));
        }
    }
    let refused = refused.into_inner();
    if !refused.is_empty() {
        return Err(Failure::RefRejected(with_server_text(
            refused.join("; "),
            said.into_inner(),
        )));
    }
    tracing::info!(source, target, "harvest: pushed");
    Ok(())
}

/// libgit2's message when the server's unpack of the pushed pack failed.
const UNPACK_FAILED: &str = "unpacking the sent packfile failed on the remote";

/// `text`, followed by what the server said on the side band (its lines
/// joined), when it said anything.
fn with_server_text(text: String, said: String) -> String {
    let said: String = said
        .split(['\n', '\r'])
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    if said.is_empty() {
        text
    } else {
        format!("{text} (the server said: {said})")
    }
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

    use super::super::harvest::tests::harvester;

    /// Holds [`Harvester::with_remote`] under `policy` to its row of the
    /// retry table (3 attempts, 1 s doubling to 4 s, within the caller's
    /// bound), its attempts scripted and its waits recorded. The harvest's
    /// failures carry no `Retry-After`: they are classified from git2's
    /// error codes ([`classify`]), not from the transport's registration as
    /// the clone's are.
    fn holds_to_its_row(policy: Policy, what: &str) {
        use crate::client::retry::Recorder;
        use std::time::Duration;

        let (h, _runtime) = harvester();
        let later = || Instant::now() + Duration::from_secs(60);
        let scripted = |script: Vec<Result<(), Failure>>| {
            let mut script = std::collections::VecDeque::from(script);
            move || script.pop_front().unwrap_or(Ok(()))
        };
        let transport = || Err(Failure::Transport("HTTP 503".into()));

        // Transport failures: exactly 3 attempts, the backoff between them
        // (jitter never past the cap), then the give-up.
        for (draw, waits) in [(0.5, [1000, 2000]), (1.0, [1200, 2400])] {
            let pace = Recorder::new(draw);
            let mut made = 0;
            let mut op = scripted(vec![transport(), transport(), transport()]);
            let result = h.with_remote_paced(later(), what, policy, &*pace, || {
                made += 1;
                op()
            });
            match result {
                Err(RemoteError::Exhausted { attempts: 3, last }) => assert_eq!(last, "HTTP 503"),
                other => panic!("{what}: {other:?}"),
            }
            assert_eq!((made, pace.take_ms()), (3, waits.to_vec()), "{what}");
        }

        // Two failures, then success.
        let pace = Recorder::new(0.5);
        let op = scripted(vec![transport(), transport()]);
        h.with_remote_paced(later(), what, policy, &*pace, op)
            .unwrap();
        assert_eq!(pace.take_ms(), [1000, 2000], "{what}");

        // Verdicts (refused by the server or git, local failures): one
        // attempt, no wait.
        for failure in [
            Failure::Verdict("HTTP 403".into()),
            Failure::RefRejected("non-fast-forward".into()),
            Failure::Local("disk full".into()),
        ] {
            let pace = Recorder::new(0.5);
            let mut made = 0;
            let mut op = scripted(vec![Err(failure)]);
            let result = h.with_remote_paced(later(), what, policy, &*pace, || {
                made += 1;
                op()
            });
            assert!(
                matches!(result, Err(RemoteError::Refused(_) | RemoteError::Local(_))),
                "{what}: {result:?}"
            );
            assert_eq!((made, pace.take_ms()), (1, vec![]), "{what}");
        }

        // The caller's bound: a wait that would end past it gives up, and
        // no attempt starts once it is spent.
        let pace = Recorder::new(0.5);
        let bound = Instant::now() + Duration::from_millis(1500);
        let op = scripted(vec![transport(), transport(), transport()]);
        match h.with_remote_paced(bound, what, policy, &*pace, op) {
            Err(RemoteError::OutOfTime { attempts: 2, .. }) => {}
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(pace.take_ms(), [1000], "{what}");
        let result = h.with_remote_paced(
            Instant::now(),
            what,
            policy,
            &*pace,
            || -> Result<(), Failure> { panic!("an attempt started after the bound") },
        );
        assert!(
            matches!(result, Err(RemoteError::NoTime)),
            "{what}: {result:?}"
        );
    }

    #[test]
    fn row_git_push_in_the_harvest_3_attempts_1s_doubling_to_4s() {
        holds_to_its_row(Policy::HARVEST_PUSH, "harvest push");
    }

    #[test]
    fn row_the_workspace_syncs_fetch_and_push_3_attempts_each_1s_doubling_to_4s() {
        // Each of the two is its own call with its own attempts.
        holds_to_its_row(Policy::WORKSPACE_SYNC, "workspace sync fetch");
        holds_to_its_row(Policy::WORKSPACE_SYNC, "workspace sync push");
    }
}
