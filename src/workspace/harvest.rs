//! The harvest (PROTOCOL.md 4.5): the agent's work never exists only inside
//! the sandbox. After every turn, and at boot for a reused `repo/`:
//!
//! 1. what the agent left uncommitted (tracked or new, not ignored) is
//!    committed on the current `HEAD` (whatever branch, or detached) with the
//!    agent's git identity and a message naming the run and its outcome;
//!    files over the size limit (`--harvest-max-file-size`) are left out and
//!    stay in the work tree, since the git host would refuse the push and
//!    every later one with it; commits of the agent that hold such files are
//!    replaced by one commit without them before the push (the originals
//!    kept on `refs/hosted-boot/oversized/<name>`);
//! 2. the session branch is fetched; `HEAD` is pushed to it when that is a
//!    fast-forward, otherwise to `<branch>-recovered-<runId>`
//!    (`<branch>-recovered-at-boot` at boot), never forced;
//! 3. once `HEAD` is on the remote, the local session branch is brought to
//!    the remote's (checked out, `HEAD` attached to it), so that the next
//!    turn starts from the remote's head. A `HEAD` that could not be pushed
//!    is left where it is: a commit is never dropped before it was pushed.
//!
//! Before each turn, [`Harvester::sync_before_turn`] does the reverse
//! (PROTOCOL.md 4.5 "Before a turn"): it fetches the session branch and
//! moves `repo/` to its tip, so that the turn starts from what the user
//! pushed meanwhile. Local work the remote lacks is pushed first (never
//! forced); commits a force push dropped are kept on a local ref, never
//! pushed back.
//!
//! The push goes through [`super::transport`] with the boot's own
//! credential helper and remote URL, not the ones in `repo/.git/config`
//! (which the agent can edit). Transport failures are retried (section 2
//! table: 3 attempts, 1 s, cap 4 s); a rejection by git or the server is a
//! verdict. Everything runs on tokio's blocking pool, within a time bound;
//! the report is what was known when the bound ran out.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use git2::{
    AutotagOption, Delta, Direction, ErrorClass, ErrorCode, FetchOptions, FileMode, IndexAddOption,
    ObjectType, Oid, PushOptions, RemoteCallbacks, Repository, RepositoryState, ResetType,
    Signature, StatusOptions, TreeWalkMode, TreeWalkResult,
};

use super::clone::{GIT_USER_EMAIL, GIT_USER_NAME};
use super::transport::{CredentialHelpers, HttpContext, register_remote};
use crate::client::retry::{self, Pace, Policy};
use crate::wire::{
    HarvestResult, MAX_LISTED_COMMITS, PushError, PushErrorCode, RunOutcome, SkippedFile,
    SyncOutcome, SyncWarning, SyncWarningCode, WorkspaceSync, truncate_reason,
};

/// The name of the harvest of a reused `repo/` at boot (PROTOCOL.md 4.5).
pub const RECOVERED_AT_BOOT: &str = "recovered-at-boot";

/// Most bytes of the server's side-band text kept for a refusal's report.
const MAX_REMOTE_TEXT: usize = 2048;

/// Most `-N` suffixes tried when a recovery branch name is taken.
const MAX_RECOVERY_SUFFIX: u32 = 100;

/// Serialises the runner's own git work on `repo/`: a harvest that outlived
/// its bound (still pushing on the blocking pool) finishes before the next
/// harvest, or the next turn's start point, touches the repository.
static REPO_LOCK: Mutex<()> = Mutex::new(());

fn lock_repo() -> MutexGuard<'static, ()> {
    REPO_LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// What every harvest of a boot shares: where `repo/` is and how to reach
/// its remote.
#[derive(Clone, Debug)]
pub struct Harvester {
    /// `repo/`.
    pub repo_dir: PathBuf,
    /// The session remote (the clone URL; no user info).
    pub remote_url: String,
    /// The session branch.
    pub branch: String,
    /// The boot's `credential.helper` value (`!'<exe>' credential --context
    /// '<path>'`); the one in `repo/.git/config` is not trusted.
    pub credential_helper: String,
    /// The HTTP client the transport uses.
    pub http: HttpContext,
    /// Push attempts and backoff ([`Policy::HARVEST_PUSH`], scaled by the
    /// boot's timings).
    pub push_policy: Policy,
    /// Files larger than this many bytes are left out of what the harvest
    /// commits and pushes (`--harvest-max-file-size`, 4.5); `None`: no limit.
    pub max_file_size: Option<u64>,
}

/// One harvest.
#[derive(Clone, Debug)]
pub struct HarvestJob {
    /// The run id, or [`RECOVERED_AT_BOOT`].
    pub name: String,
    /// The turn's outcome (`None` at boot), for the commit message: work in
    /// progress unless `succeeded`.
    pub outcome: Option<RunOutcome>,
    /// The commit the turn started from (the workspace sync's `startSha`), the
    /// base of `commits` and the diff statistics; `None`: the remote's
    /// session branch.
    pub start: Option<String>,
    /// The time bound (60 s after a turn, 10 s on a graceful stop).
    pub bound: Duration,
}

/// Why an attempt to reach the remote failed.
#[derive(Debug)]
enum Failure {
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
enum RemoteError {
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
    fn describe(&self, what: &str) -> String {
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

fn message(e: &git2::Error) -> String {
    e.message().replace('\0', "")
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
    /// Whether `repo/` holds work that may not be on the remote: uncommitted
    /// changes, or a `HEAD` other than the last known remote session branch.
    /// Local only (no request); `true` when it cannot tell.
    pub async fn has_local_work(&self) -> bool {
        let dir = self.repo_dir.clone();
        let branch = self.branch.clone();
        tokio::task::spawn_blocking(move || {
            let _guard = lock_repo();
            let Ok(repo) = Repository::open(&dir) else {
                return true;
            };
            let dirty = repo
                .statuses(Some(&mut status_options()))
                .map(|s| !s.is_empty())
                .unwrap_or(true);
            let head = repo.head().ok().and_then(|h| h.target());
            let known = repo
                .refname_to_id(&format!("refs/remotes/origin/{branch}"))
                .ok();
            dirty || head.is_none() || head != known
        })
        .await
        .unwrap_or(true)
    }

    /// Harvests `repo/` (see the module documentation) on the blocking pool,
    /// within `job.bound`. Never fails: what went wrong is in `pushError`
    /// (a failed push does not fail the turn), and when the bound runs out
    /// the report holds what was done by then.
    pub async fn harvest(&self, job: HarvestJob) -> HarvestResult {
        self.harvest_until(job, std::future::pending()).await
    }

    /// [`Harvester::harvest`], cut short when `cut` completes first (a stop
    /// signal): the report is then what was done by that moment, with a
    /// `harvest_timeout` error carrying `cut`'s message. The blocking work
    /// goes on in the background until its own bound (the next harvest waits
    /// for it).
    pub async fn harvest_until(
        &self,
        job: HarvestJob,
        cut: impl std::future::Future<Output = String>,
    ) -> HarvestResult {
        let progress = Arc::new(Mutex::new(empty_result(&job.name, &self.branch)));
        let deadline = Instant::now() + job.bound;
        let bound = job.bound;
        let this = self.clone();
        let shared = progress.clone();
        let task =
            tokio::task::spawn_blocking(move || this.harvest_blocking(&job, deadline, &shared));
        let ended = |code: PushErrorCode, text: String| {
            let mut r = progress.lock().unwrap_or_else(|p| p.into_inner()).clone();
            r.pushed = false;
            r.push_error = Some(PushError {
                code,
                message: text,
            });
            r
        };
        let result = tokio::select! {
            joined = tokio::time::timeout(bound, task) => match joined {
                Ok(Ok(result)) => result,
                Ok(Err(e)) => ended(
                    PushErrorCode::HarvestFailed,
                    format!("the harvest task failed: {e}"),
                ),
                Err(_) => ended(
                    PushErrorCode::HarvestTimeout,
                    format!(
                        "the harvest did not finish within its bound of {} ms; the work stays in repo/ for the next harvest",
                        bound.as_millis()
                    ),
                ),
            },
            why = cut => ended(PushErrorCode::HarvestTimeout, why),
        };
        log_result(&result);
        result
    }

    /// [`Harvester::harvest`] on the calling thread: blocking, never from an
    /// async task. `progress` receives the report as it fills in.
    pub fn harvest_blocking(
        &self,
        job: &HarvestJob,
        deadline: Instant,
        progress: &Mutex<HarvestResult>,
    ) -> HarvestResult {
        let _guard = lock_repo();
        let mut r = empty_result(&job.name, &self.branch);
        let publish = |r: &HarvestResult| {
            *progress.lock().unwrap_or_else(|p| p.into_inner()) = r.clone();
        };
        let fail = |mut r: HarvestResult, code, text: String| {
            r.pushed = false;
            r.push_error = Some(PushError {
                code,
                message: text,
            });
            r
        };
        let repo = match Repository::open(&self.repo_dir) {
            Ok(repo) => repo,
            Err(e) => {
                return fail(
                    r,
                    PushErrorCode::HarvestFailed,
                    format!("cannot open {}: {}", self.repo_dir.display(), message(&e)),
                );
            }
        };

        // 1. Commit what the agent left (files over the size limit left out).
        match commit_uncommitted(&repo, job, self.max_file_size, &mut r.skipped_files) {
            Ok(commit) => r.harvest_commit = commit.map(|c| c.to_string()),
            Err(e) => {
                return fail(
                    r,
                    PushErrorCode::HarvestFailed,
                    format!(
                        "cannot commit the work left in {}: {}",
                        self.repo_dir.display(),
                        message(&e)
                    ),
                );
            }
        }
        let head = match repo.head().and_then(|h| h.peel_to_commit()) {
            Ok(c) => c.id(),
            Err(e) => {
                return fail(
                    r,
                    PushErrorCode::HarvestFailed,
                    format!(
                        "{} has no commit at HEAD: {}",
                        self.repo_dir.display(),
                        message(&e)
                    ),
                );
            }
        };
        r.head_sha = Some(head.to_string());
        publish(&r);

        // 2. and 3. Fetch, push, bring the local session branch to the
        // remote's; transport failures retried within the bound.
        let url = self.remote_url.as_str();
        let mut head = head;
        // The session branch's tip as the runner last saw it on the remote
        // (at boot as kept before the reuse fetch), read before the first
        // fetch moves it.
        let at_boot = job.name == RECOVERED_AT_BOOT;
        let known = at_boot
            .then(|| repo.refname_to_id(super::clone::LAST_SEEN_REF).ok())
            .flatten()
            .or_else(|| {
                repo.refname_to_id(&format!("refs/remotes/origin/{}", self.branch))
                    .ok()
            });
        let attempt = || {
            let result = self.push_once(&repo, &mut head, known, job, &mut r);
            if result.is_err() {
                publish(&r);
            }
            result
        };
        let outcome = self.with_remote(deadline, "harvest push", attempt);
        if at_boot
            && outcome.is_ok()
            && let Ok(mut kept) = repo.find_reference(super::clone::LAST_SEEN_REF)
            && let Err(e) = kept.delete()
        {
            tracing::warn!(error = %message(&e), "harvest at boot: cannot remove the last seen remote tip");
        }
        match outcome {
            Ok(()) => {
                r.pushed = true;
                r
            }
            Err(RemoteError::NoTime) => fail(
                r,
                PushErrorCode::HarvestTimeout,
                "the harvest's time bound ran out before the push".to_string(),
            ),
            Err(RemoteError::Setup(text)) => fail(r, PushErrorCode::PushFailed, text),
            Err(RemoteError::Local(text)) => fail(
                r,
                PushErrorCode::HarvestFailed,
                format!(
                    "cannot leave the files over the size limit out of the agent's commits in {}: {text}",
                    self.repo_dir.display()
                ),
            ),
            Err(RemoteError::Refused(text)) => fail(
                r,
                PushErrorCode::PushRejected,
                format!("the push to {url} was refused: {text}"),
            ),
            Err(RemoteError::Exhausted { attempts, last }) => fail(
                r,
                PushErrorCode::PushFailed,
                format!("the push to {url} failed after {attempts} attempts: {last}"),
            ),
            Err(RemoteError::OutOfTime { attempts, last }) => fail(
                r,
                PushErrorCode::HarvestTimeout,
                format!(
                    "the harvest's time bound ran out after {attempts} push attempts; the last failed: {last}"
                ),
            ),
        }
    }

    /// Runs `op` (git work on the remote) with the boot's transport and
    /// credential helper registered for the remote URL, retrying transport
    /// failures as the section 2 table says for the harvest (3 attempts, 1 s,
    /// cap 4 s) within `deadline`; each request's timeout is cut to what is
    /// left of it. `what` names the work in the log.
    fn with_remote<T>(
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
                    if retry::Attempts::AtMost(failures) == policy.attempts {
                        return Err(RemoteError::Exhausted {
                            attempts: failures,
                            last: text,
                        });
                    }
                    let wait = retry::wait(&policy, failures - 1, None, retry::REAL.draw());
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

    /// One attempt: fetch the session branch, push `head` where it may go,
    /// then bring the local session branch to the remote's (its own commits
    /// pushed first when no remote branch, `head`, nor `known`, the tip last
    /// seen on the remote, holds them).
    fn push_once(
        &self,
        repo: &Repository,
        head_at: &mut Oid,
        known: Option<Oid>,
        job: &HarvestJob,
        r: &mut HarvestResult,
    ) -> Result<(), Failure> {
        let url = self.remote_url.as_str();
        let branch = self.branch.as_str();
        let remote = fetch(repo, url, branch)?;

        // Files over the size limit in the agent's own commits: the git host
        // would refuse the whole push, this one and every later one.
        if let Some(max) = self.max_file_size {
            let found = oversized_blobs(repo, *head_at, &remote.heads, max)
                .map_err(|e| Failure::Local(message(&e)))?;
            if !found.is_empty() {
                *head_at = leave_out_oversized(repo, *head_at, &remote, &found, job, max, r)
                    .map_err(|e| Failure::Local(message(&e)))?;
            }
        }
        let head = *head_at;

        let base = job
            .start
            .as_deref()
            .and_then(|s| Oid::from_str(s).ok())
            .filter(|oid| repo.find_commit(*oid).is_ok())
            .or(remote.session_tip)
            .unwrap_or(head);
        match statistics(repo, base, head) {
            Ok((commits, files, insertions, deletions)) => {
                r.commits = commits;
                r.files_changed = files;
                r.insertions = insertions;
                r.deletions = deletions;
            }
            Err(e) => {
                tracing::warn!(error = %message(&e), "harvest: cannot count the turn's changes")
            }
        }

        let contains = |a: Oid, b: Oid| a == b || repo.graph_descendant_of(a, b).unwrap_or(false);
        let tip = remote.session_tip;
        let session_ref = format!("refs/heads/{branch}");
        let mut on_session = false;
        match tip {
            // Everything in HEAD is on the remote already.
            Some(tip) if contains(tip, head) => {}
            Some(tip) if contains(head, tip) => match push(repo, url, &session_ref) {
                Ok(()) => on_session = true,
                Err(Failure::RefRejected(text)) => {
                    tracing::warn!(error = %text, "harvest: the session branch refused the push; using a recovery branch");
                }
                Err(other) => return Err(other),
            },
            // The remote moved on (or lost the session branch): recovery.
            _ => {}
        }
        let is_recovery = !on_session && !tip.is_some_and(|t| contains(t, head));
        // At boot, a HEAD wholly on the session branch as last seen, which
        // the remote no longer has: a force push while the runner was down
        // dropped it, the user's choice (as in the sync before a turn); kept
        // on a local ref, not pushed back.
        let mut discarded = is_recovery
            && job.name == RECOVERED_AT_BOOT
            && tip.is_some()
            && known.is_some_and(|k| contains(k, head));
        if discarded && let Some(known) = known {
            match keep_discarded(repo, &job.name, known, &remote.heads) {
                Ok(Some((name, _, count))) => {
                    tracing::warn!(discarded_ref = %name, count, "harvest at boot: the remote session branch dropped commits; kept locally, not pushed back");
                    r.discarded_ref = Some(name);
                }
                Ok(None) => {}
                Err(e) => {
                    // Not kept locally: pushed to a recovery branch instead.
                    tracing::warn!(error = %message(&e), "harvest at boot: cannot keep the commits the remote dropped on a local ref");
                    discarded = false;
                }
            }
        }
        if is_recovery && !discarded {
            let name =
                recovery_name(repo, branch, &job.name, &remote.heads, head).ok_or_else(|| {
                    Failure::Verdict(format!(
                        "no free recovery branch name for {branch}-recovered-{}",
                        recovery_suffix(&job.name)
                    ))
                })?;
            let there = remote.heads.get(&format!("refs/heads/{name}"));
            if there != Some(&head) {
                push(repo, url, &format!("refs/heads/{name}"))?;
            }
            tracing::warn!(recovery_branch = %name, head = %head, "harvest: the session branch moved on; the work went to a recovery branch");
            r.recovery_branch = Some(name);
        }

        // The session branch's tip on the remote now.
        let remote_tip = if on_session { Some(head) } else { tip };
        let Some(remote_tip) = remote_tip else {
            return Ok(());
        };
        // The local session branch may hold commits HEAD does not (the agent
        // committed on it, then moved HEAD away): pushed before it moves.
        let mut seen = vec![head];
        seen.extend(known);
        match save_local_branch(repo, url, branch, &job.name, &remote.heads, &seen) {
            Ok(saved) => {
                if saved.is_some() {
                    r.local_branch_recovery = saved;
                }
            }
            Err(
                Failure::Transport(text)
                | Failure::RefRejected(text)
                | Failure::Verdict(text)
                | Failure::Local(text),
            ) => {
                // HEAD is on the remote; the branch stays where it is (its
                // commits kept on it) and the next harvest tries again.
                tracing::warn!(error = %text, "harvest: cannot push the local session branch's own commits; it is not moved");
                return Ok(());
            }
        }
        if let Err(e) = bring_local_to(repo, branch, remote_tip) {
            // The work is on the remote; the next harvest tries again.
            tracing::warn!(error = %message(&e), "harvest: cannot bring the local session branch to the remote's");
        }
        Ok(())
    }
    /// Brings `repo/` to the remote's session branch before the turn
    /// `run_id` (PROTOCOL.md 4.1 step 3, 4.5 "Before a turn") on the
    /// blocking pool; the network part is bounded by `bound` (each request's
    /// timeout cut to what is left of it) and nothing in `repo/` is changed
    /// once it ran out, so the agent never starts while this still works on
    /// `repo/`. Never fails: a problem is the report's `warning`, and the
    /// turn then starts from the local `HEAD`.
    pub async fn sync_before_turn(&self, run_id: &str, bound: Duration) -> WorkspaceSync {
        let this = self.clone();
        let run = run_id.to_string();
        let deadline = Instant::now() + bound;
        let report =
            match tokio::task::spawn_blocking(move || this.sync_blocking(&run, deadline)).await {
                Ok(report) => report,
                Err(e) => {
                    let mut report = empty_sync(&self.branch);
                    report.warning = Some(SyncWarning {
                        code: SyncWarningCode::RepoUnreadable,
                        message: format!("the workspace sync task failed: {e}"),
                    });
                    report
                }
            };
        log_sync(&report);
        report
    }

    /// [`Harvester::sync_before_turn`] on the calling thread: blocking,
    /// never from an async task.
    pub fn sync_blocking(&self, run_id: &str, deadline: Instant) -> WorkspaceSync {
        let _guard = lock_repo();
        let url = self.remote_url.as_str();
        let branch = self.branch.as_str();
        let mut s = empty_sync(branch);
        let warn = |mut s: WorkspaceSync, code, text: String| {
            s.outcome = SyncOutcome::KeptLocal;
            s.warning = Some(SyncWarning {
                code,
                message: truncate_reason(&text),
            });
            s
        };
        let repo = match Repository::open(&self.repo_dir) {
            Ok(repo) => repo,
            Err(e) => {
                let text = format!("cannot open {}: {}", self.repo_dir.display(), message(&e));
                return warn(s, SyncWarningCode::RepoUnreadable, text);
            }
        };
        let head = match repo.head().and_then(|h| h.peel_to_commit()) {
            Ok(c) => c.id(),
            Err(e) => {
                let text = format!(
                    "{} has no commit at HEAD: {}",
                    self.repo_dir.display(),
                    message(&e)
                );
                return warn(s, SyncWarningCode::RepoUnreadable, text);
            }
        };
        s.local_sha = Some(head.to_string());
        s.start_sha = Some(head.to_string());
        // The session branch's tip as the runner last saw it on the remote
        // (its clone, its last harvest), read before the fetch moves it.
        let known = repo
            .refname_to_id(&format!("refs/remotes/origin/{branch}"))
            .ok();

        let remote = match self.with_remote(deadline, "workspace sync fetch", || {
            fetch(&repo, url, branch)
        }) {
            Ok(remote) => remote,
            Err(e) => {
                let code = match e {
                    RemoteError::NoTime | RemoteError::OutOfTime { .. } => {
                        SyncWarningCode::SyncTimeout
                    }
                    _ => SyncWarningCode::FetchFailed,
                };
                let text = format!(
                    "{}; the turn starts from the local HEAD",
                    e.describe(&format!("the fetch of {branch} from {url}"))
                );
                return warn(s, code, text);
            }
        };
        let Some(tip) = remote.session_tip else {
            let text = format!(
                "the remote {url} has no branch {branch}; the turn starts from the local HEAD"
            );
            return warn(s, SyncWarningCode::BranchMissing, text);
        };
        s.remote_sha = Some(tip.to_string());

        let contains = |a: Oid, b: Oid| a == b || repo.graph_descendant_of(a, b).unwrap_or(false);
        let on_remote = remote.heads.values().any(|t| contains(*t, head));
        let known_pushed = known.is_some_and(|k| contains(k, head));
        let mut target = tip;
        let mut pushed = false;
        if !on_remote && !known_pushed {
            // Work that is on no remote branch (an earlier push failed): saved
            // before the workspace moves, never forced.
            if contains(head, tip) {
                let session_ref = format!("refs/heads/{branch}");
                if let Err(e) = self.with_remote(deadline, "workspace sync push", || {
                    push(&repo, url, &session_ref)
                }) {
                    let text = format!(
                        "{}; the turn starts from the local HEAD",
                        e.describe(&format!("the push of the local work to {branch}"))
                    );
                    return warn(s, SyncWarningCode::PushFailed, text);
                }
                target = head;
                pushed = true;
            } else {
                let name = format!("before-{run_id}");
                let Some(recovery) = recovery_name(&repo, branch, &name, &remote.heads, head)
                else {
                    let text = format!(
                        "no free recovery branch name for {branch}-recovered-{name}; the turn starts from the local HEAD"
                    );
                    return warn(s, SyncWarningCode::PushFailed, text);
                };
                let recovery_ref = format!("refs/heads/{recovery}");
                if remote.heads.get(&recovery_ref) != Some(&head)
                    && let Err(e) = self.with_remote(deadline, "workspace sync push", || {
                        push(&repo, url, &recovery_ref)
                    })
                {
                    let text = format!(
                        "{}; the turn starts from the local HEAD",
                        e.describe(&format!("the push of the local work to {recovery}"))
                    );
                    return warn(s, SyncWarningCode::PushFailed, text);
                }
                tracing::warn!(recovery_branch = %recovery, head = %head, "workspace sync: local work the remote lacked went to a recovery branch");
                s.recovery_branch = Some(recovery);
            }
        }

        // Commits the session branch no longer has (the user force-pushed):
        // the user's choice stands, they are not pushed back; repo/ keeps
        // them on a local ref.
        if let Some(known) = known
            && !contains(tip, known)
        {
            match keep_discarded(&repo, run_id, known, &remote.heads) {
                Ok(Some((name, commits, count))) => {
                    tracing::warn!(discarded_ref = %name, count, "workspace sync: the remote session branch dropped commits; kept locally, not pushed back");
                    s.discarded_ref = Some(name);
                    s.discarded_commits = commits;
                    s.discarded_count = Some(count);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %message(&e), "workspace sync: cannot keep the commits the remote dropped on a local ref");
                }
            }
        }

        // The local session branch may hold commits HEAD does not (the agent
        // committed on it, then moved HEAD away): pushed before it moves.
        let mut seen = vec![head];
        seen.extend(known);
        match self.with_remote(deadline, "workspace sync push", || {
            save_local_branch(
                &repo,
                url,
                branch,
                &format!("before-{run_id}"),
                &remote.heads,
                &seen,
            )
        }) {
            Ok(saved) => s.local_branch_recovery = saved,
            Err(e) => {
                let text = format!(
                    "{}; the turn starts from the local HEAD",
                    e.describe(&format!(
                        "the push of the local {branch}'s own commits to a recovery branch"
                    ))
                );
                return warn(s, SyncWarningCode::PushFailed, text);
            }
        }

        if Instant::now() >= deadline {
            let text = "the workspace sync's time bound ran out before the checkout; the turn starts from the local HEAD".to_string();
            return warn(s, SyncWarningCode::SyncTimeout, text);
        }
        if let Err(e) = bring_local_to(&repo, branch, target) {
            let text = format!(
                "cannot check out {target} (the remote's {branch}): {}; the turn starts from the local HEAD",
                message(&e)
            );
            return warn(s, SyncWarningCode::CheckoutFailed, text);
        }
        s.start_sha = Some(target.to_string());
        s.outcome = if pushed {
            SyncOutcome::Pushed
        } else if s.recovery_branch.is_some() || s.discarded_ref.is_some() {
            SyncOutcome::Reset
        } else if head == tip {
            SyncOutcome::UpToDate
        } else {
            SyncOutcome::FastForward
        };
        s
    }
}

fn empty_sync(branch: &str) -> WorkspaceSync {
    WorkspaceSync {
        branch: branch.to_string(),
        outcome: SyncOutcome::KeptLocal,
        local_sha: None,
        remote_sha: None,
        start_sha: None,
        recovery_branch: None,
        discarded_ref: None,
        discarded_commits: Vec::new(),
        discarded_count: None,
        local_branch_recovery: None,
        warning: None,
    }
}

fn log_sync(s: &WorkspaceSync) {
    match &s.warning {
        None => tracing::info!(
            outcome = ?s.outcome,
            local = s.local_sha.as_deref().unwrap_or(""),
            start = s.start_sha.as_deref().unwrap_or(""),
            recovery_branch = s.recovery_branch.as_deref().unwrap_or(""),
            discarded_ref = s.discarded_ref.as_deref().unwrap_or(""),
            "workspace synced to the remote's session branch"
        ),
        Some(w) => tracing::warn!(
            code = ?w.code,
            error = %w.message,
            start = s.start_sha.as_deref().unwrap_or(""),
            "workspace sync: the turn starts from the local HEAD"
        ),
    }
}

/// Keeps `known` (the session branch's tip as last seen on the remote) on
/// `refs/hosted-boot/discarded/<runId>` (`-2`, `-3`, … when taken by another
/// commit) when it has commits that no branch of the remote had at the
/// fetch (`heads`). Returns the ref, the commits (newest first, at most
/// [`MAX_LISTED_COMMITS`]) and their count; `None` when there are none.
fn keep_discarded(
    repo: &Repository,
    run_id: &str,
    known: Oid,
    heads: &HashMap<String, Oid>,
) -> Result<Option<(String, Vec<String>, u64)>, git2::Error> {
    let mut walk = repo.revwalk()?;
    walk.push(known)?;
    for tip in heads.values() {
        if repo.find_commit(*tip).is_ok() {
            walk.hide(*tip)?;
        }
    }
    let mut commits = Vec::new();
    let mut count = 0u64;
    for oid in walk {
        let oid = oid?;
        count += 1;
        if commits.len() < MAX_LISTED_COMMITS {
            commits.push(oid.to_string());
        }
    }
    if count == 0 {
        return Ok(None);
    }
    let name = keep_ref(repo, "refs/hosted-boot/discarded", run_id, known)?;
    Ok(Some((name, commits, count)))
}

fn empty_result(name: &str, branch: &str) -> HarvestResult {
    HarvestResult {
        name: name.to_string(),
        branch: branch.to_string(),
        head_sha: None,
        pushed: false,
        commits: 0,
        files_changed: 0,
        insertions: 0,
        deletions: 0,
        harvest_commit: None,
        recovery_branch: None,
        push_error: None,
        skipped_files: Vec::new(),
        oversized_ref: None,
        local_branch_recovery: None,
        discarded_ref: None,
    }
}

fn log_result(r: &HarvestResult) {
    match &r.push_error {
        None => tracing::info!(
            name = %r.name,
            head = r.head_sha.as_deref().unwrap_or(""),
            commits = r.commits,
            files_changed = r.files_changed,
            recovery_branch = r.recovery_branch.as_deref().unwrap_or(""),
            harvest_commit = r.harvest_commit.as_deref().unwrap_or(""),
            "harvest done"
        ),
        Some(e) => tracing::error!(
            name = %r.name,
            head = r.head_sha.as_deref().unwrap_or(""),
            code = ?e.code,
            error = %e.message,
            "harvest: the work is not on the remote"
        ),
    }
}

fn status_options() -> StatusOptions {
    let mut opts = StatusOptions::new();
    opts.include_untracked(true)
        .recurse_untracked_dirs(true)
        .include_ignored(false)
        .exclude_submodules(true);
    opts
}

fn commit_message(job: &HarvestJob) -> String {
    let name = &job.name;
    match job.outcome {
        Some(RunOutcome::Succeeded) => format!(
            "{name}: work the agent left uncommitted\n\nCommitted by hosted-boot after the turn succeeded (the harvest, PROTOCOL.md 4.5).\n"
        ),
        Some(outcome) => {
            let outcome = outcome.as_str();
            format!(
                "WIP {name}: work in progress (turn {outcome})\n\nCommitted by hosted-boot when the turn ended {outcome}, so that the work is not lost (the harvest, PROTOCOL.md 4.5).\n"
            )
        }
        None => format!(
            "WIP {name}: work found in repo/ when the runner restarted\n\nCommitted by hosted-boot at boot, so that the work is not lost (the harvest, PROTOCOL.md 4.5).\n"
        ),
    }
}

/// Commits every change of the work tree that git does not ignore on
/// `HEAD`, except files over `max` bytes (new or changed), which stay in the
/// work tree uncommitted and are noted in `skipped`. `None` when there is
/// nothing to commit.
fn commit_uncommitted(
    repo: &Repository,
    job: &HarvestJob,
    max: Option<u64>,
    skipped: &mut Vec<SkippedFile>,
) -> Result<Option<Oid>, git2::Error> {
    // The agent's process group is gone by now: an index lock left behind is
    // a git command killed mid-way (an interrupt), which would otherwise
    // block every harvest from here on.
    let index_lock = repo.path().join("index.lock");
    if index_lock.exists() {
        tracing::warn!(path = %index_lock.display(), "harvest: removing the index lock a killed git command left");
        if let Err(e) = std::fs::remove_file(&index_lock) {
            tracing::warn!(path = %index_lock.display(), error = %e, "harvest: cannot remove the index lock");
        }
    }
    let statuses = repo.statuses(Some(&mut status_options()))?;
    if statuses.is_empty() {
        return Ok(None);
    }
    let workdir = repo.workdir().map(Path::to_path_buf);
    // The size of a regular file of the work tree over the limit (a
    // symbolic link is its target's name, never large).
    let over = |path: &Path| -> Option<u64> {
        let max = max?;
        let meta = std::fs::symlink_metadata(workdir.as_ref()?.join(path)).ok()?;
        (meta.is_file() && meta.len() > max).then_some(meta.len())
    };
    let left_out: RefCell<Vec<(String, u64)>> = RefCell::new(Vec::new());
    // Skipped before it is hashed: a file of gigabytes is never read.
    let mut guard = |path: &Path, _spec: &[u8]| -> i32 {
        match over(path) {
            Some(bytes) => {
                left_out
                    .borrow_mut()
                    .push((path.to_string_lossy().into_owned(), bytes));
                1
            }
            None => 0,
        }
    };
    let mut index = repo.index()?;
    if let Err(e) = index
        .add_all(["*"], IndexAddOption::DEFAULT, Some(&mut guard))
        .and_then(|()| index.update_all(["*"], Some(&mut guard)))
    {
        // One path libgit2 cannot add (a nested repository, say) must not
        // keep the others from being saved: add them one by one.
        tracing::warn!(error = %message(&e), "harvest: adding everything failed; adding path by path");
        index.read(true)?;
        for entry in statuses.iter() {
            let Ok(path) = entry.path() else { continue };
            let path = Path::new(path);
            if let Some(bytes) = over(path) {
                left_out
                    .borrow_mut()
                    .push((path.to_string_lossy().into_owned(), bytes));
                continue;
            }
            let added = if repo.workdir().is_some_and(|w| w.join(path).exists()) {
                index.add_path(path)
            } else {
                index.remove_path(path)
            };
            if let Err(e) = added {
                tracing::warn!(path = %path.display(), error = %message(&e), "harvest: path left out of the commit");
            }
        }
    }
    for (path, bytes) in left_out.into_inner() {
        note_skipped(skipped, &path, bytes);
    }
    // An unborn HEAD (`git checkout --orphan`): the work becomes a root
    // commit of that branch.
    let parent = match repo.head() {
        Ok(head) => Some(head.peel_to_commit()?),
        Err(e) if e.code() == ErrorCode::UnbornBranch => None,
        Err(e) => return Err(e),
    };
    if let Some(max) = max
        && let Some(parent) = &parent
    {
        // A large file the agent staged (`git add`) without committing is in
        // the index already: back to HEAD's version for those paths.
        let staged = staged_over(repo, &index, &parent.tree()?, max)?;
        if !staged.is_empty() {
            index.write()?;
            let paths: Vec<&str> = staged.iter().map(|(p, _)| p.as_str()).collect();
            repo.reset_default(Some(parent.as_object()), paths)?;
            index.read(true)?;
            for (path, bytes) in &staged {
                note_skipped(skipped, path, *bytes);
            }
        }
    }
    index.write()?;
    let tree_id = index.write_tree()?;
    if parent.as_ref().is_some_and(|p| p.tree_id() == tree_id) {
        return Ok(None);
    }
    let tree = repo.find_tree(tree_id)?;
    let sig = Signature::now(GIT_USER_NAME, GIT_USER_EMAIL)?;
    let oid = repo.commit(
        Some("HEAD"),
        &sig,
        &sig,
        &commit_message(job),
        &tree,
        &parent.iter().collect::<Vec<_>>(),
    )?;
    if repo.state() != RepositoryState::Clean {
        // A merge or rebase the agent left half done: its commit is made,
        // the state files would only confuse the next turn.
        repo.cleanup_state()?;
    }
    tracing::info!(commit = %oid, name = %job.name, "harvest: committed what the agent left uncommitted");
    Ok(Some(oid))
}

/// Paths whose blob in `index` is new against `tree` and over `max` bytes.
fn staged_over(
    repo: &Repository,
    index: &git2::Index,
    tree: &git2::Tree<'_>,
    max: u64,
) -> Result<Vec<(String, u64)>, git2::Error> {
    let odb = repo.odb()?;
    let diff = repo.diff_tree_to_index(Some(tree), Some(index), None)?;
    let mut out = Vec::new();
    for delta in diff.deltas() {
        if !matches!(
            delta.status(),
            Delta::Added | Delta::Modified | Delta::Typechange | Delta::Renamed | Delta::Copied
        ) {
            continue;
        }
        let file = delta.new_file();
        let Ok((bytes, ObjectType::Blob)) = odb.read_header(file.id()) else {
            continue;
        };
        if bytes as u64 > max
            && let Some(path) = file.path()
        {
            out.push((path.to_string_lossy().into_owned(), bytes as u64));
        }
    }
    Ok(out)
}

/// Records `path` (`bytes` long) as left out of the harvest, once.
fn note_skipped(skipped: &mut Vec<SkippedFile>, path: &str, bytes: u64) {
    if !skipped.iter().any(|s| s.path == path) {
        tracing::warn!(
            path,
            bytes,
            "harvest: a file over the size limit is left out"
        );
        skipped.push(SkippedFile {
            path: path.to_string(),
            bytes,
        });
    }
}

/// A blob over the size limit that the commits to push bring.
struct Oversized {
    /// Where a commit of the range added it.
    path: String,
    blob: Oid,
    bytes: u64,
}

/// The blobs over `max` bytes that the commits from `head` back to the
/// remote's branches (`heads`, those known here) add or change, each once,
/// except those the tree of a remote branch's tip already holds: the host
/// has them (its limit is higher than the runner's), so they are no new
/// object for it, and leaving out a path that only moved such a file (a
/// rename) would delete the file from the branch.
fn oversized_blobs(
    repo: &Repository,
    head: Oid,
    heads: &HashMap<String, Oid>,
    max: u64,
) -> Result<Vec<Oversized>, git2::Error> {
    let mut walk = repo.revwalk()?;
    walk.push(head)?;
    for tip in heads.values() {
        if repo.find_commit(*tip).is_ok() {
            walk.hide(*tip)?;
        }
    }
    let odb = repo.odb()?;
    let mut found: Vec<Oversized> = Vec::new();
    for oid in walk {
        let commit = repo.find_commit(oid?)?;
        let tree = commit.tree()?;
        let parent = match commit.parent_count() {
            0 => None,
            _ => Some(commit.parent(0)?.tree()?),
        };
        let diff = repo.diff_tree_to_tree(parent.as_ref(), Some(&tree), None)?;
        for delta in diff.deltas() {
            if !matches!(
                delta.status(),
                Delta::Added | Delta::Modified | Delta::Typechange | Delta::Renamed | Delta::Copied
            ) {
                continue;
            }
            let file = delta.new_file();
            if !matches!(file.mode(), FileMode::Blob | FileMode::BlobExecutable) {
                continue;
            }
            let Ok((bytes, ObjectType::Blob)) = odb.read_header(file.id()) else {
                continue;
            };
            let bytes = bytes as u64;
            if bytes > max && !found.iter().any(|f| f.blob == file.id()) {
                let path = file
                    .path()
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default();
                found.push(Oversized {
                    path,
                    blob: file.id(),
                    bytes,
                });
            }
        }
    }
    if !found.is_empty() {
        let mut on_remote = std::collections::HashSet::new();
        for tip in heads.values() {
            let Ok(tree) = repo.find_commit(*tip).and_then(|c| c.tree()) else {
                continue;
            };
            tree.walk(TreeWalkMode::PreOrder, |_, entry| {
                if entry.kind() == Some(ObjectType::Blob)
                    && found.iter().any(|f| f.blob == entry.id())
                {
                    on_remote.insert(entry.id());
                }
                TreeWalkResult::Ok
            })?;
        }
        found.retain(|f| !on_remote.contains(&f.blob));
    }
    Ok(found)
}

/// Replaces the agent's commits from `head` back to the remote with one
/// commit of `head`'s tree without the blobs in `found` (a path whose blob
/// is left out keeps the base's version, or is removed), on the remote's
/// session tip when `head` contains it, else on their merge base. `HEAD`
/// moves to it (a mixed reset: the work tree keeps the files, now
/// uncommitted); the agent's commits stay on
/// `refs/hosted-boot/oversized/<name>`. Returns the new commit.
fn leave_out_oversized(
    repo: &Repository,
    head: Oid,
    remote: &RemoteState,
    found: &[Oversized],
    job: &HarvestJob,
    max: u64,
    r: &mut HarvestResult,
) -> Result<Oid, git2::Error> {
    let base = match remote.session_tip {
        Some(tip) if tip == head || repo.graph_descendant_of(head, tip).unwrap_or(false) => {
            Some(tip)
        }
        Some(tip) => repo.merge_base(head, tip).ok(),
        None => None,
    };
    let head_commit = repo.find_commit(head)?;
    let head_tree = head_commit.tree()?;
    let base_commit = base.map(|b| repo.find_commit(b)).transpose()?;
    let base_tree = base_commit.as_ref().map(|c| c.tree()).transpose()?;

    // Every path of HEAD's tree that holds one of those blobs.
    let mut paths: Vec<(String, u64)> = Vec::new();
    head_tree.walk(TreeWalkMode::PreOrder, |root, entry| {
        if let Some(f) = found.iter().find(|f| f.blob == entry.id())
            && let Ok(name) = entry.name()
        {
            paths.push((format!("{root}{name}"), f.bytes));
        }
        TreeWalkResult::Ok
    })?;
    let mut update = git2::build::TreeUpdateBuilder::new();
    for (path, _) in &paths {
        match base_tree
            .as_ref()
            .and_then(|t| t.get_path(Path::new(path)).ok())
        {
            Some(entry) if entry.kind() == Some(ObjectType::Blob) => {
                let mode = if entry.filemode() == i32::from(FileMode::BlobExecutable) {
                    FileMode::BlobExecutable
                } else {
                    FileMode::Blob
                };
                update.upsert(path, entry.id(), mode);
            }
            _ => {
                update.remove(path);
            }
        }
    }
    let tree = repo.find_tree(update.create_updated(repo, &head_tree)?)?;

    let kept = keep_ref(repo, "refs/hosted-boot/oversized", &job.name, head)?;
    let mut listed: Vec<String> = paths
        .iter()
        .map(|(p, b)| format!("  {p} ({b} bytes)"))
        .collect();
    // Blobs a later commit of the agent removed again: left out all the same.
    for f in found {
        if !paths.iter().any(|(p, _)| *p == f.path) {
            listed.push(format!(
                "  {} ({} bytes, removed again by the agent)",
                f.path, f.bytes
            ));
        }
    }
    let mut subjects = Vec::new();
    let mut walk = repo.revwalk()?;
    walk.push(head)?;
    if let Some(b) = base {
        walk.hide(b)?;
    }
    for oid in walk.take(MAX_LISTED_COMMITS) {
        let c = repo.find_commit(oid?)?;
        subjects.push(format!(
            "  {} {}",
            &c.id().to_string()[..12],
            c.summary().ok().flatten().unwrap_or("")
        ));
    }
    let text = format!(
        "{name}: the agent's commits without the files over the size limit\n\n\
         Committed by hosted-boot (the harvest, PROTOCOL.md 4.5): the git host would refuse\n\
         files over {max} bytes, and with them every later push. Left out (kept in the work tree\n\
         when still there):\n{files}\n\n\
         The agent's commits, kept in repo/ at {kept} ({head}):\n{subjects}\n",
        name = job.name,
        files = listed.join("\n"),
        subjects = subjects.join("\n"),
    );
    let sig = Signature::now(GIT_USER_NAME, GIT_USER_EMAIL)?;
    let parents: Vec<&git2::Commit> = base_commit.iter().collect();
    let new = repo.commit(None, &sig, &sig, &text, &tree, &parents)?;
    repo.reset(repo.find_commit(new)?.as_object(), ResetType::Mixed, None)?;
    tracing::warn!(commit = %new, kept = %kept, "harvest: the agent's commits held files over the size limit; pushing them without those files");

    for f in found {
        let path = paths
            .iter()
            .find(|(p, _)| *p == f.path)
            .map(|(p, _)| p.as_str())
            .unwrap_or(f.path.as_str());
        note_skipped(&mut r.skipped_files, path, f.bytes);
    }
    // The harvest's own commit, if any, is folded into the new one.
    r.harvest_commit = None;
    r.head_sha = Some(new.to_string());
    r.oversized_ref = Some(kept);
    Ok(new)
}

/// Points `<prefix>/<name>` (or `-2`, `-3`, … when that name holds another
/// commit) at `target`; returns the ref's name.
fn keep_ref(
    repo: &Repository,
    prefix: &str,
    name: &str,
    target: Oid,
) -> Result<String, git2::Error> {
    let base = format!("{prefix}/{name}");
    for n in 1..=MAX_RECOVERY_SUFFIX {
        let refname = if n == 1 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        match repo.refname_to_id(&refname) {
            Ok(there) if there == target => return Ok(refname),
            Ok(_) => continue,
            Err(_) => {
                repo.reference(&refname, target, false, "hosted-boot: kept")?;
                return Ok(refname);
            }
        }
    }
    Err(git2::Error::from_str(&format!(
        "no free ref name for {base}"
    )))
}

/// `commits` from `base` to `head`, and the diff statistics from their
/// merge base to `head`.
fn statistics(
    repo: &Repository,
    base: Oid,
    head: Oid,
) -> Result<(u64, u64, u64, u64), git2::Error> {
    let mut walk = repo.revwalk()?;
    walk.push(head)?;
    walk.hide(base)?;
    let commits = walk.filter(Result::is_ok).count() as u64;
    let from = repo.merge_base(base, head).unwrap_or(base);
    let from_tree = repo.find_commit(from)?.tree()?;
    let head_tree = repo.find_commit(head)?.tree()?;
    let stats = repo
        .diff_tree_to_tree(Some(&from_tree), Some(&head_tree), None)?
        .stats()?;
    Ok((
        commits,
        stats.files_changed() as u64,
        stats.insertions() as u64,
        stats.deletions() as u64,
    ))
}

/// The remote as the harvest's fetch found it.
struct RemoteState {
    /// The session branch's tip (downloaded), `None` when it is missing.
    session_tip: Option<Oid>,
    /// Every branch on the remote (`refs/heads/…` → tip).
    heads: HashMap<String, Oid>,
}

/// Lists the remote's refs and downloads the session branch when its tip is
/// not here yet; updates `refs/remotes/origin/<branch>`.
fn fetch(repo: &Repository, url: &str, branch: &str) -> Result<RemoteState, Failure> {
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
fn push(repo: &Repository, url: &str, target: &str) -> Result<(), Failure> {
    push_ref(repo, url, "HEAD", target)
}

/// Pushes the local ref `source` (`HEAD`, a full ref name) to `target` (a
/// full ref name), never forced.
fn push_ref(repo: &Repository, url: &str, source: &str, target: &str) -> Result<(), Failure> {
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

/// Saves the local session branch before it is moved (PROTOCOL.md 4.5 step
/// 3: never drop a commit that was not pushed somewhere). When its tip is on
/// no remote branch (`heads`, those known here) and not in `seen` (commits
/// on the remote by now, or the tip the runner last saw there), it is pushed,
/// never forced, to `<branch>-recovered-<name>-branch` (`-2`, … when taken).
/// Returns that branch, `None` when nothing needed saving.
fn save_local_branch(
    repo: &Repository,
    url: &str,
    branch: &str,
    name: &str,
    heads: &HashMap<String, Oid>,
    seen: &[Oid],
) -> Result<Option<String>, Failure> {
    let local_ref = format!("refs/heads/{branch}");
    let Ok(local) = repo.refname_to_id(&local_ref) else {
        return Ok(None);
    };
    let contains = |a: Oid, b: Oid| a == b || repo.graph_descendant_of(a, b).unwrap_or(false);
    let held = heads
        .values()
        .chain(seen)
        .any(|t| repo.find_commit(*t).is_ok() && contains(*t, local));
    if held {
        return Ok(None);
    }
    let suffix = format!("{}-branch", recovery_suffix(name));
    let recovery = recovery_name(repo, branch, &suffix, heads, local).ok_or_else(|| {
        Failure::Verdict(format!(
            "no free recovery branch name for {branch}-recovered-{suffix}"
        ))
    })?;
    let target = format!("refs/heads/{recovery}");
    if heads.get(&target) != Some(&local) {
        push_ref(repo, url, &local_ref, &target)?;
    }
    tracing::warn!(recovery_branch = %recovery, commit = %local, "the local session branch held commits on no remote branch; pushed them to a recovery branch before moving it");
    Ok(Some(recovery))
}

fn recovery_suffix(name: &str) -> &str {
    if name == RECOVERED_AT_BOOT {
        "at-boot"
    } else {
        name
    }
}

/// `<branch>-recovered-<runId>` (`<branch>-recovered-at-boot` at boot), or
/// the same with `-2`, `-3`, … when the remote has that branch and `head`
/// does not contain its tip.
fn recovery_name(
    repo: &Repository,
    branch: &str,
    name: &str,
    heads: &HashMap<String, Oid>,
    head: Oid,
) -> Option<String> {
    let base = format!("{branch}-recovered-{}", recovery_suffix(name));
    (1..=MAX_RECOVERY_SUFFIX)
        .map(|n| {
            if n == 1 {
                base.clone()
            } else {
                format!("{base}-{n}")
            }
        })
        .filter(|candidate| git2::Reference::is_valid_name(&format!("refs/heads/{candidate}")))
        .find(
            |candidate| match heads.get(&format!("refs/heads/{candidate}")) {
                None => true,
                Some(tip) => *tip == head || repo.graph_descendant_of(head, *tip).unwrap_or(false),
            },
        )
}

/// Checks out `tip` and points the local session branch, its
/// remote-tracking branch and `HEAD` at it. The checkout is git's safe one:
/// a file left uncommitted (one over the size limit, say) is carried over
/// when `tip` does not change it, and the checkout fails, changing nothing,
/// when it would be overwritten; so does an ignored file `tip` would
/// overwrite (a tracked file of that name).
fn bring_local_to(repo: &Repository, branch: &str, tip: Oid) -> Result<(), git2::Error> {
    // The remote-tracking branch is the runner's record of the remote's
    // tip (what the next sync tells a force push by), kept even when
    // nothing else moves.
    repo.reference(
        &format!("refs/remotes/origin/{branch}"),
        tip,
        true,
        "hosted-boot: harvest",
    )?;
    let local = format!("refs/heads/{branch}");
    let attached = repo
        .head()
        .ok()
        .and_then(|h| h.name().ok().map(str::to_string))
        .is_some_and(|n| n == local);
    let at_tip = repo.head().ok().and_then(|h| h.target()) == Some(tip);
    if attached && at_tip {
        return Ok(());
    }
    // Check out first, while HEAD still names the old commit: files of the
    // old commit that the tip does not have are removed, not left behind as
    // untracked files that the next harvest would commit again.
    let commit = repo.find_commit(tip)?;
    let mut checkout = git2::build::CheckoutBuilder::new();
    // git's safe checkout overwrites ignored files by default; an ignored
    // file is the agent's (never harvested), so the checkout fails instead.
    checkout.safe().overwrite_ignored(false);
    repo.checkout_tree(commit.as_object(), Some(&mut checkout))?;
    repo.reference(
        &local,
        tip,
        true,
        "hosted-boot: harvest: the remote's session branch",
    )?;
    repo.set_head(&local)?;
    tracing::info!(branch, commit = %tip, "harvest: local session branch brought to the remote's");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(name: &str, outcome: Option<RunOutcome>) -> HarvestJob {
        HarvestJob {
            name: name.to_string(),
            outcome,
            start: None,
            bound: Duration::from_secs(1),
        }
    }

    #[test]
    fn commit_messages_name_the_run_and_the_outcome() {
        let m = commit_message(&job("run-2", Some(RunOutcome::Succeeded)));
        assert!(
            m.starts_with("run-2: work the agent left uncommitted\n\n"),
            "{m}"
        );
        let m = commit_message(&job("run-3", Some(RunOutcome::Interrupted)));
        assert!(
            m.starts_with("WIP run-3: work in progress (turn interrupted)\n"),
            "{m}"
        );
        let m = commit_message(&job("run-4", Some(RunOutcome::Failed)));
        assert!(
            m.starts_with("WIP run-4: work in progress (turn failed)\n"),
            "{m}"
        );
        let m = commit_message(&job(RECOVERED_AT_BOOT, None));
        assert!(
            m.starts_with("WIP recovered-at-boot: work found in repo/"),
            "{m}"
        );
    }

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

    #[test]
    fn recovery_names_skip_taken_branches() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let sig = Signature::now("t", "t@example.invalid").unwrap();
        let tree = repo
            .find_tree(repo.index().unwrap().write_tree().unwrap())
            .unwrap();
        let a = repo
            .commit(Some("HEAD"), &sig, &sig, "a", &tree, &[])
            .unwrap();
        let parent = repo.find_commit(a).unwrap();
        let b = repo
            .commit(Some("HEAD"), &sig, &sig, "b", &tree, &[&parent])
            .unwrap();
        let other = repo.commit(None, &sig, &sig, "other", &tree, &[]).unwrap();
        let mut heads = HashMap::new();
        assert_eq!(
            recovery_name(&repo, "s", "run-2", &heads, b).as_deref(),
            Some("s-recovered-run-2")
        );
        assert_eq!(
            recovery_name(&repo, "s", RECOVERED_AT_BOOT, &heads, b).as_deref(),
            Some("s-recovered-at-boot")
        );
        // Taken by an ancestor of HEAD: a fast-forward, same name.
        heads.insert("refs/heads/s-recovered-run-2".to_string(), a);
        assert_eq!(
            recovery_name(&repo, "s", "run-2", &heads, b).as_deref(),
            Some("s-recovered-run-2")
        );
        // Taken by unrelated work: the next free suffix.
        heads.insert("refs/heads/s-recovered-run-2".to_string(), other);
        heads.insert("refs/heads/s-recovered-run-2-2".to_string(), other);
        assert_eq!(
            recovery_name(&repo, "s", "run-2", &heads, b).as_deref(),
            Some("s-recovered-run-2-3")
        );
    }
}
