//! The harvest (PROTOCOL.md 4.5): the agent's work never exists only inside
//! the sandbox. After every turn, and at boot for a reused `repo/`:
//!
//! 1. what the agent left uncommitted (tracked or new, not ignored) is
//!    committed on the current `HEAD` (whatever branch, or detached) with the
//!    agent's git identity and a message naming the run and its outcome
//!    ([`super::commit`]); files over the size limit
//!    (`--harvest-max-file-size`) are left out and stay in the work tree,
//!    since the git host would refuse the push and every later one with it;
//!    commits of the agent that hold such files are replaced by one commit
//!    without them before the push (the originals kept on
//!    `refs/hosted-boot/oversized/<name>`; [`super::size_limit`]);
//! 2. the session branch is fetched; when the commits to push hold a secret
//!    the runner knows (in any commit, not only the last), they are replaced
//!    by one commit without the paths that hold it, the agent's commits kept
//!    on `refs/hosted-boot/blocked/<name>` and the files left in the work
//!    tree ([`super::secret_guard`], which every push passes); `HEAD` is pushed to it when that is a
//!    fast-forward, otherwise to `<branch>-recovered-<runId>`
//!    (`<branch>-recovered-at-boot` at boot), never forced
//!    ([`super::push`], names from [`super::recovery`]);
//! 3. once `HEAD` is on the remote, the local session branch is brought to
//!    the remote's (checked out, `HEAD` attached to it), so that the next
//!    turn starts from the remote's head ([`super::local_branch`]). A `HEAD`
//!    that could not be pushed is left where it is: a commit is never
//!    dropped before it was pushed.
//!
//! Before each turn, [`Harvester::sync_before_turn`] ([`super::sync`]) does
//! the reverse (PROTOCOL.md 4.5 "Before a turn"): it fetches the session
//! branch and moves `repo/` to its tip, so that the turn starts from what
//! the user pushed meanwhile. Local work the remote lacks is pushed first
//! (never forced); commits a force push dropped are kept on a local ref,
//! never pushed back.
//!
//! The push goes through [`super::transport`] with the boot's own
//! credential helper and remote URL, not the ones in `repo/.git/config`
//! (which the agent can edit); [`super::remote`] retries transport failures
//! (section 2 table: 3 attempts, 1 s, cap 4 s); a rejection by git or the
//! server is a verdict. Everything runs on tokio's blocking pool, within a
//! time bound; the report is what was known when the bound ran out.
//!
//! This module owns the [`Harvester`] (what every harvest and sync of a boot
//! shares), the harvest's entry points and its report.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::commit::{commit_uncommitted, status_options};
use super::remote::RemoteError;
use super::secret_guard::PushGate;
use super::transport::HttpContext;
use crate::client::retry::Policy;
use crate::wire::{HarvestResult, PushError, PushErrorCode, RunOutcome};

/// The name of the harvest of a reused `repo/` at boot (PROTOCOL.md 4.5).
pub const RECOVERED_AT_BOOT: &str = "recovered-at-boot";

/// Serialises the runner's own git work on `repo/`: a harvest that outlived
/// its bound (still pushing on the blocking pool) finishes before the next
/// harvest, or the next turn's start point, touches the repository.
static REPO_LOCK: Mutex<()> = Mutex::new(());

/// The runner's hold on `repo/` ([`Harvester::lock_repo`]): while it
/// lives, no other git work of the runner touches the repository.
///
/// With an agent user, the thread that holds it acts as that user
/// ([`AgentUser::act_as`](crate::agent_user::AgentUser::act_as)) until it
/// is dropped: the repository is the agent's, and so is everything in its
/// configuration and `.git` (a `core.worktree`, a symlinked reflog), which
/// the runner's git must not follow as root (PROTOCOL.md 3). Run the git
/// work on the thread that took the hold: whatever it creates or rewrites
/// (objects, refs, the index, checked-out files) is then the agent user's
/// from the start, so the agent's own git can still commit, fetch and push
/// (PROTOCOL.md 3, "The agent as another user"), and the drop walks
/// nothing. Only a hold that could not act as the user (which refuses all
/// git work, [`RepoHold::refused`]) gives `repo/` back at its drop, with
/// the lock still held.
pub(super) struct RepoHold<'a> {
    _lock: MutexGuard<'static, ()>,
    /// The watcher unblocks this thread's open of a FIFO (issue 31).
    _holder: super::unblock::Holder,
    harvester: &'a Harvester,
    acting: Option<crate::agent_user::ActingAs>,
    refused: Option<String>,
}

impl RepoHold<'_> {
    /// Why the thread could not act as the agent user, when it could not:
    /// the caller must then leave `repo/` alone (fail closed), naming this.
    pub(super) fn refused(&self) -> Option<&str> {
        self.refused.as_deref()
    }
}

impl Drop for RepoHold<'_> {
    fn drop(&mut self) {
        // Acting as the user, the hold's work made nothing of root's: the
        // give-back's walk (an `lstat` of every entry of `repo/`, 30,097 on
        // the clone bench's repository) would find nothing to change.
        if self.acting.take().is_none() {
            self.harvester.give_repo_to_owner();
        }
    }
}

/// Makes `repo/` safe for the runner's git before a hold's work (issue
/// 31): clears what the agent may have planted to block it
/// ([`super::special_files::clear`], each removal logged) and checks the
/// files its configuration includes ([`super::repo_config::check_includes`]).
///
/// Errors: what cannot be cleared or is refused, named, with what to do.
pub(super) fn ready_for_git(repo_dir: &Path) -> Result<(), String> {
    for (path, kind) in super::special_files::clear(repo_dir).map_err(|e| e.0)? {
        tracing::warn!(path = %path.display(), kind, "removed a special file where the runner's git opens a file (it would block git; it cannot hold work)");
    }
    super::repo_config::check_includes(repo_dir).map_err(|e| e.0)
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
    /// `HOSTED_BOOT_TEST_TIME_SCALE` (1.0 in production): the retry
    /// policies the harvest and the workspace sync name
    /// ([`Policy::HARVEST_PUSH`], [`Policy::WORKSPACE_SYNC`]) are scaled by
    /// it.
    pub time_scale: f64,
    /// Files larger than this many bytes are left out of what the harvest
    /// commits and pushes (`--harvest-max-file-size`, 4.5); `None`: no limit.
    pub max_file_size: Option<u64>,
    /// `--agent-user`: who `repo/` belongs to. After the clone every entry
    /// the user does not own is given to it (`lchown`, no link followed);
    /// the runner's later git work in `repo/` acts as the user
    /// ([`RepoHold`]), so what it writes is the user's already; `None`:
    /// nothing changes owner.
    pub owner: Option<crate::agent_user::AgentUser>,
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

/// Moves `HEAD` (and the branch it names) to `commit` by a mixed reset:
/// the index follows, the work tree keeps its files (what a commit that
/// replaced the agent's left out stays there, uncommitted).
pub(super) fn move_head(repo: &git2::Repository, commit: git2::Oid) -> Result<(), git2::Error> {
    repo.reset(
        repo.find_commit(commit)?.as_object(),
        git2::ResetType::Mixed,
        None,
    )
}

pub(super) fn message(e: &git2::Error) -> String {
    e.message().replace('\0', "")
}

impl Harvester {
    /// Takes the runner's hold on `repo/` (see [`RepoHold`]), with what
    /// the agent planted to block git cleared first ([`ready_for_git`]).
    pub(super) fn lock_repo(&self) -> RepoHold<'_> {
        self.hold(true)
    }

    /// [`Harvester::lock_repo`] while the agent runs (a checkpoint): nothing
    /// of `repo/` is removed (the agent may be using it); the includes are
    /// checked, and a FIFO the runner's git opens is left to the watcher
    /// ([`super::unblock`]).
    pub(super) fn lock_repo_as_found(&self) -> RepoHold<'_> {
        self.hold(false)
    }

    fn hold(&self, clear: bool) -> RepoHold<'_> {
        let (acting, mut refused) = match self.owner.as_ref().map(|o| (o, o.act_as())) {
            None => (None, None),
            Some((_, Ok(acting))) => (Some(acting), None),
            Some((owner, Err(e))) => (
                None,
                Some(format!(
                    "cannot act as the agent user {} for the runner's git work in repo/ ({e}); repo/ is left as it is",
                    owner.name
                )),
            ),
        };
        // Cleared before the lock (no agent runs when a hold clears): a
        // checkpoint that holds it, blocked opening a FIFO the agent planted
        // (each freed by the watcher in turn), then finds the rest gone and
        // ends, instead of keeping this harvest or sync waiting (found by a
        // review: 400 of them made the harvest time out).
        if refused.is_none() && clear {
            refused = ready_for_git(&self.repo_dir).err();
        }
        let lock = REPO_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let holder = super::unblock::Holder::enter();
        if refused.is_none() && !clear {
            refused = super::repo_config::check_includes(&self.repo_dir)
                .err()
                .map(|e| e.0);
        }
        RepoHold {
            _lock: lock,
            _holder: holder,
            harvester: self,
            acting,
            refused,
        }
    }

    /// Gives `repo/` to [`Harvester::owner`], when there is one: after the
    /// clone (the boot calls it) and at the end of each [`RepoHold`]. A
    /// failure is logged: the agent's git may then be refused, the runner's
    /// work is done.
    pub fn give_repo_to_owner(&self) {
        let Some(owner) = &self.owner else { return };
        match owner.give_tree(&self.repo_dir) {
            Ok(0) => {}
            Ok(changed) => {
                tracing::debug!(changed, user = %owner.name, "repo/ given back to the agent user")
            }
            Err(e) => {
                tracing::warn!(path = %self.repo_dir.display(), user = %owner.name, error = %e, "cannot give repo/ to the agent user")
            }
        }
    }

    /// Whether `repo/` holds work that may not be on the remote: uncommitted
    /// changes, or a `HEAD` other than the last known remote session branch.
    /// Local only (no request); `true` when it cannot tell.
    pub async fn has_local_work(&self) -> bool {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let (dir, branch) = (&this.repo_dir, &this.branch);
            let hold = this.lock_repo();
            if hold.refused().is_some() {
                return true;
            }
            let Ok(repo) = super::repo_config::open(dir) else {
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
        let task = crate::concurrency::spawn_blocking_in_span(move || {
            this.harvest_blocking(&job, deadline, &shared)
        });
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
    // long: the harvest's steps in order over one `repo` and one report,
    // each ending it with its own push error code; the last match maps every
    // way the push can fail to a code (PROTOCOL.md 4.5).
    pub fn harvest_blocking(
        &self,
        job: &HarvestJob,
        deadline: Instant,
        progress: &Mutex<HarvestResult>,
    ) -> HarvestResult {
        let hold = self.lock_repo();
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
        if let Some(why) = hold.refused() {
            return fail(r, PushErrorCode::HarvestFailed, why.to_string());
        }
        let repo = match super::repo_config::open(&self.repo_dir) {
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
        // A work tree libgit2 cannot commit (an index with an extension it
        // does not know: a split or sparse index) must not keep the agent's
        // own commits from the remote: they are pushed, and the report says
        // what was not (found by a review, issue 33).
        let uncommitted = match commit_uncommitted(
            &repo,
            job,
            self.max_file_size,
            &mut r.skipped_files,
        ) {
            Ok(commit) => {
                r.harvest_commit = commit.map(|c| c.to_string());
                None
            }
            Err(e) => {
                let text = format!(
                    "cannot commit the work left uncommitted in {}: {}; the agent's own commits are pushed without it, and it stays in the work tree for the next harvest",
                    self.repo_dir.display(),
                    message(&e)
                );
                tracing::warn!("harvest: {text}");
                Some(text)
            }
        };
        let head = match repo.head().and_then(|h| h.peel_to_commit()) {
            Ok(c) => c.id(),
            Err(e) => {
                return fail(
                    r,
                    PushErrorCode::HarvestFailed,
                    format!(
                        "cannot read the commit at HEAD in {} (none, or one libgit2 cannot parse): {}",
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
        let gate = PushGate::new(&self.branch, &self.http.redactor);
        let attempt = || {
            let result = self.push_once(&repo, &mut head, known, job, &mut r, &gate);
            if result.is_err() {
                publish(&r);
            }
            result
        };
        let outcome = self.with_remote(deadline, "harvest push", Policy::HARVEST_PUSH, attempt);
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
                // `headSha` is on the remote; what the work tree held is
                // not, and `pushError` says so (PROTOCOL.md 4.5).
                if let Some(text) = uncommitted {
                    r.push_error = Some(PushError {
                        code: PushErrorCode::HarvestFailed,
                        message: text,
                    });
                }
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
                    "the harvest's local git work in {} failed before its push (leaving out files over the size limit or holding a secret, reading the commits to push): {text}; the work stays in the sandbox for the next harvest",
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
}

fn empty_result(name: &str, branch: &str) -> HarvestResult {
    HarvestResult {
        name: name.to_string(),
        branch: branch.to_string(),
        ..HarvestResult::default()
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
            code = %crate::wire::wire_name(&e.code),
            error = %e.message,
            "harvest: the work is not on the remote"
        ),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A harvester whose remote is never reached (the operations of the
    /// tests that use it are scripted), and the runtime its transport would
    /// use.
    pub(in crate::workspace) fn harvester() -> (Harvester, tokio::runtime::Runtime) {
        crate::tls::install_crypto_provider();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let harvester = Harvester {
            repo_dir: "/nonexistent/repo".into(),
            remote_url: "https://git.example/o/r.git".into(),
            branch: "main".into(),
            credential_helper: "!true".into(),
            http: HttpContext {
                client: crate::tls::http_client(None).unwrap(),
                runtime: runtime.handle().clone(),
                request_timeout: Duration::from_secs(10),
                redactor: crate::redact::Redactor::new(),
                stall: Duration::from_secs(30),
                broker: None,
            },
            time_scale: 1.0,
            max_file_size: None,
            owner: None,
        };
        (harvester, runtime)
    }

    /// PROTOCOL.md 3, "The agent as another user": the thread of a hold acts
    /// as the agent user, so what the hold's work writes in `repo/` is the
    /// user's from the start, and the hold's drop walks nothing (the walk
    /// cost 1.9 s per hold on the clone bench's 30,097 entries). A
    /// root-owned entry that was there before the hold (which no walk
    /// after the clone would leave) tells whether a walk ran: before, the
    /// drop gave it to the user.
    #[test]
    fn a_hold_that_acted_as_the_agent_user_walks_nothing_at_its_drop() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        if let Err(reason) = hosted_boot_test_support::root("acting as another user") {
            hosted_boot_test_support::skip(reason);
            return;
        }
        let Ok(user) = crate::agent_user::AgentUser::resolve("nobody", 0) else {
            hosted_boot_test_support::skip("no `nobody` user here (65534, as Debian has)");
            return;
        };
        let root = tempfile::tempdir().unwrap();
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let repo = root.path().join("repo");
        std::fs::create_dir_all(repo.join(".git")).unwrap();
        user.give_tree(&repo).unwrap();
        let planted = repo.join("root-owned");
        std::fs::write(&planted, "x").unwrap();

        let (mut h, _runtime) = harvester();
        h.repo_dir = repo.clone();
        h.owner = Some(user.clone());
        let hold = h.lock_repo();
        assert_eq!(hold.refused(), None);
        std::fs::write(repo.join("written-in-the-hold"), "x").unwrap();
        drop(hold);

        let uid = |p: &Path| std::fs::symlink_metadata(p).unwrap().uid();
        assert_eq!(uid(&repo.join("written-in-the-hold")), user.uid);
        assert_eq!(uid(&planted), 0, "the hold's drop walked repo/");
        assert_eq!(rustix::process::geteuid().as_raw(), 0, "root again");
    }
}
